"""The ``tsgate`` command: ``serve`` runs the gateway; ``dev`` starts local Cassandra/Redis."""

import argparse
import dataclasses
import json
import os
import re
import sys
from pathlib import Path

from gateway import __version__
from gateway.app.config import (
    DELETE_SETTINGS,
    DOWNSAMPLE_SETTINGS,
    IMPORT_SETTINGS,
    OVERRIDES_SETTINGS,
    SCHEMA_SETTINGS,
    ConfigError,
    add_arguments,
    build_config,
    did_you_mean,
    setting_flags,
)
from gateway.app.logs import setup_logging
from gateway.app.workers import Worker, supervise

DESCRIPTION = (
    "tsgate, a time-series protocol gateway: 'tsgate serve' runs the gateway, 'tsgate dev' runs a local"
    " Cassandra or Redis; 'tsgate COMMAND --help' lists the flags of a command."
)
INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


def _serve(namespace: argparse.Namespace) -> int:
    """One gateway process (``--workers 1``), a worker started by a supervisor, or the supervisor."""
    config = build_config(namespace)
    worker = Worker.from_environment()
    if worker is not None:
        setup_logging(config.log_level, f"worker {worker.index} pid {os.getpid()}")
    elif config.worker_count > 1:
        setup_logging(config.log_level, f"supervisor pid {os.getpid()}")
        return supervise(config, setting_flags(namespace))
    else:
        setup_logging(config.log_level)
    from gateway.app.service import run

    return run(config, worker)


def _schema(namespace: argparse.Namespace) -> int:
    """``schema print`` shows the CQL for the settings; ``schema apply`` creates or upgrades it;
    ``schema expire-old-index`` gives index rows written before the time index their TTL."""
    from gateway.store.cassandra import CassandraStore, parse_url
    from gateway.store.cassandra_schema import schema_text

    config = build_config(namespace)
    if not config.store:
        raise ConfigError("--store cassandra://HOST/KEYSPACE is required (the embedded store makes its own schema)")
    try:
        options = parse_url(config.store_url, config.layout)
    except ValueError as error:
        raise ConfigError(f"--store: {error}") from None
    if namespace.action != "expire-old-index" and (namespace.max_ranges is not None or namespace.restart):
        raise ConfigError("--max-ranges and --restart belong to `tsgate schema expire-old-index`")
    if namespace.action == "print":
        print(schema_text(options.schema), end="")
        return 0
    setup_logging(config.log_level)
    if namespace.action == "expire-old-index":
        return _expire_old_index(config, CassandraStore(options), namespace)
    try:
        statements = CassandraStore(options).apply_schema()
    except Exception as error:
        print(f"tsgate schema apply: {error}", file=sys.stderr)
        return 1
    notes = [statement for statement in statements if statement.startswith("--")]
    print(f"schema applied: keyspace {options.schema.keyspace}, {len(statements) - len(notes)} statements")
    for note in notes:
        print(note)
    return 0


def _expire_old_index(config, store, namespace: argparse.Namespace) -> int:
    """``schema expire-old-index``: the all-time index rows a gateway older than the time index
    wrote without a TTL get the TTL of their tenant's retentions (--overrides), printing progress."""
    from gateway.core.overrides import Overrides, OverridesError

    if namespace.max_ranges is not None and namespace.max_ranges < 1:
        raise ConfigError("--max-ranges must be at least 1")
    overrides = Overrides(config)
    try:
        overrides.load()
    except OverridesError as error:
        raise ConfigError(f"--overrides: {error}") from None
    store.retentions = overrides.retentions
    try:
        walked = store.expire_old_index(lambda line: print(line, flush=True), namespace.max_ranges, namespace.restart)
    except KeyboardInterrupt:
        print("tsgate schema expire-old-index: interrupted; run it again to continue", file=sys.stderr)
        return 130
    except Exception as error:
        print(f"tsgate schema expire-old-index: {error} (run it again to continue)", file=sys.stderr)
        return 1
    rate = walked.rows_seen / walked.seconds if walked.seconds else 0.0
    print(
        f"{walked.ranges} token ranges walked ({walked.done_ranges} of {walked.total_ranges} done)"
        f" in {walked.seconds:.1f} s: {walked.rows_seen:,} rows seen ({rate:,.0f} a second),"
        f" {walked.rows_rewritten:,} rewritten with a TTL"
    )
    if walked.finished:
        print("every all-time index row has a TTL: rows written before the upgrade expire with their data")
    else:
        print("stopped before the end (--max-ranges): run it again to continue where it stopped")
    return 0


def _downsample(namespace: argparse.Namespace) -> int:
    """``downsample --once``: roll up everything settled in this replica's partitions, then exit."""
    config = build_config(namespace)
    if not namespace.once:
        raise ConfigError("only --once is supported here; `tsgate serve --roles downsample` runs it continuously")
    setup_logging(config.log_level)
    from twisted.internet import defer, task

    from gateway.app.components import Components
    from gateway.app.service import settle_collector, tune_allocator

    async def once(reactor):
        components = Components(config).target("downsample-once")  # each tenant swept by its own retentions
        role, store = components.get("downsample"), components.get("store")
        try:
            await components.start_store()
        except Exception as error:  # an unreachable store: one line, as `serve` says it
            print(f"tsgate downsample: could not start: {error}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None  # task.react's way to an exit code without a traceback
        settle_collector()  # as serve does: full collector passes were a third of a seal's CPU
        tune_allocator()
        try:
            done = await role.run_once()
            failed = role.downsampler.round_failed
            print(
                f"rolled up {done} series-slots; {await role.waiting()} left pending for a later round"
                + (f" ({failed} of them failed, see the log)" if failed else ""),
                flush=True,
            )
        finally:
            await store.close()
        if failed:
            raise SystemExit(1)

    task.react(lambda reactor: defer.ensureDeferred(once(reactor)))  # exits: 0, or 1 with the error said or logged
    return 0


def _delete(namespace: argparse.Namespace) -> int:
    """``delete``: the series of Prometheus selectors or Graphite globs, in a range; ``--dry-run``
    prints what would go (series, samples) and deletes nothing."""
    config = build_config(namespace)
    if bool(namespace.match) == bool(namespace.patterns):
        raise ConfigError("give --match SELECTOR or --graphite PATTERN (each repeatable), not both")
    from gateway.http.promql_api import parse_time
    from gateway.query.promql.values import PromQLError
    from gateway.query.selection import parse_selector

    try:
        start = parse_time(namespace.start, "--start") if namespace.start else None
        end = parse_time(namespace.end, "--end") if namespace.end else None
    except PromQLError as error:
        raise ConfigError(str(error)) from None
    for selector in namespace.match:  # refused here, in one line, before the store is opened
        try:
            parse_selector(selector)
        except PromQLError as error:
            reason = str(error).rpartition(": ")[2]
            detail = "" if reason.endswith("is not a series selector") else f" ({reason})"
            raise ConfigError(
                f"--match {selector!r} is not a series selector{detail}: write one as in PromQL,"
                """ e.g. '{job="web"}' or 'up{job="web"}'"""
            ) from None
    setup_logging(config.log_level)
    from twisted.internet import defer, task

    from gateway.app.components import Components
    from gateway.core.errors import LimitExceeded
    from protocols.prometheus import utf8_labels

    async def run(reactor):
        components = Components(config).target("delete")  # the tenant's own limits and retentions
        store, shared_seen = components.get("store"), components.get("shared_seen")
        if shared_seen is not None:
            shared_seen.start()
        try:
            await components.start_store()
        except Exception as error:
            print(f"tsgate delete: could not start: {error}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None
        try:
            deleter, selection = components.get("deleter"), components.get("selection")
            try:
                if namespace.match:
                    series = await selection.select_prometheus(namespace.tenant, namespace.match)
                else:
                    series = await selection.select_graphite(namespace.tenant, namespace.patterns)
            except LimitExceeded as error:  # the tenant's --max-series-per-query, say
                print(f"tsgate delete: {error}", file=sys.stderr, flush=True)
                raise SystemExit(1) from None
            first, last = deleter.bounds(start, end)
            counts = await deleter.count(series, first, last)
            for count in counts:
                key = count.series
                name = key.metric_name if namespace.patterns else _selector(utf8_labels(key.metric_name, key.tags))
                gone = ", leaves the index" if count.removed else ""
                print(f"{name}: {count.samples} samples, {count.histograms} histograms{gone}")
            samples = sum(c.samples for c in counts)
            histograms = sum(c.histograms for c in counts)
            removed = sum(c.removed for c in counts)
            if namespace.dry_run:
                print(
                    f"dry run: would delete {samples} samples and {histograms} histograms of {len(counts)} series;"
                    f" {removed} series would leave every index",
                    flush=True,
                )
                return
            removed = await deleter.delete(series, first, last)
            print(
                f"deleted {samples} samples and {histograms} histograms of {len(counts)} series;"
                f" {removed} series left every index",
                flush=True,
            )
        finally:
            await store.close()
            if shared_seen is not None:
                await shared_seen.stop()

    task.react(lambda reactor: defer.ensureDeferred(run(reactor)))
    return 0


def _import_whisper(namespace: argparse.Namespace) -> int:
    """``import whisper DIR``: carbon's whisper files into blocks and roll-ups (gateway/app/whisper_import.py)."""
    from gateway.app.whisper_import import run_import
    from gateway.core.model import InvalidSample, validate_tenant
    from gateway.core.overrides import Overrides, OverridesError

    config = build_config(namespace)
    try:
        validate_tenant(namespace.tenant)
    except InvalidSample as error:
        raise ConfigError(f"--tenant: {error.problem}") from None
    if not namespace.directory.is_dir():
        raise ConfigError(f"{namespace.directory} is not a directory")
    if namespace.import_workers < 1:
        raise ConfigError("--workers must be at least 1")
    try:
        Overrides(config).load()  # refused here, not once in every worker
    except OverridesError as error:
        raise ConfigError(f"--overrides: {error}") from None
    setup_logging(config.log_level)
    state_dir = namespace.state_dir or config.data_dir / "import-state"
    return run_import(
        config, namespace.directory, namespace.tenant, namespace.prefix, namespace.import_workers, state_dir
    )


def _selector(labels: dict[str, str]) -> str:
    """A PromQL selector of the series, names outside PromQL's identifiers quoted as Prometheus 3 reads them."""
    name = labels.pop("__name__", "")
    inside = ", ".join(f"{_label(key)}={_quoted(value)}" for key, value in sorted(labels.items()))
    if _IDENTIFIER.fullmatch(name):
        return f"{name}{{{inside}}}"
    return "{" + ", ".join([_quoted(name), *([inside] if inside else [])]) + "}"


_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _label(name: str) -> str:
    return name if _IDENTIFIER.fullmatch(name) and ":" not in name else _quoted(name)


def _quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _overrides(namespace: argparse.Namespace) -> int:
    """``overrides check FILE``: validate an overrides file as a reload would, without a server,
    and print each tenant's effective values (JSON); exit 1 with the reason if it is refused."""

    from gateway.core.overrides import Overrides, OverridesError

    config = build_config(namespace)
    overrides = Overrides(dataclasses.replace(config, overrides=namespace.file))
    try:
        overrides.load()
    except OverridesError as error:
        print(f"tsgate overrides check: {namespace.file}: {error}", file=sys.stderr)
        return 1
    shown = overrides.shown()
    print(json.dumps({"defaults": shown["defaults"], "tenants": shown["tenants"]}, indent=2))
    print(f"{namespace.file}: ok, {len(shown['tenants'])} tenants with their own values", file=sys.stderr)
    return 0


def _auth(namespace: argparse.Namespace) -> int:
    """``auth hash-token`` / ``auth hash-password``: the hash of a secret read from stdin, as the
    ``--auth-file`` line to paste (``sha256 = "..."``, ``password = "..."``); the secret itself is
    never stored."""
    from gateway.http.auth import hash_password, hash_token

    secret = sys.stdin.readline().rstrip("\r\n")
    if not secret:
        print(f"tsgate auth {namespace.action}: give the secret on stdin", file=sys.stderr)
        return 2
    if namespace.action == "hash-token":
        print(f'sha256 = "{hash_token(secret)}"')
    else:
        print(f'password = "{hash_password(secret)}"')
    return 0


class Parser(argparse.ArgumentParser):
    """argparse without abbreviations (``--stor`` is not ``--store``), with one-line errors
    (the usage of ``serve`` is 50 flags long) and a "did you mean" for a mistyped flag."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str):
        choice = INVALID_CHOICE.search(message)  # a mistyped command (``tsgate serv``)
        if choice:
            message += did_you_mean(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self._command_parser(namespace)
            unknown = extras[0].partition("=")[0]
            flags = [flag for action in command._actions for flag in action.option_strings]
            hint = did_you_mean(unknown, flags) if unknown.startswith("-") else ""
            command.error(f"unrecognized argument {unknown}{hint}")
        return namespace

    def _command_parser(self, namespace: argparse.Namespace) -> "argparse.ArgumentParser":
        """The (sub)command's own parser, whose flags a mistyped one is compared with."""
        parser: argparse.ArgumentParser = self
        while True:
            chosen = [
                action.choices[getattr(namespace, action.dest)]
                for action in parser._actions
                if isinstance(action, argparse._SubParsersAction) and getattr(namespace, action.dest, None)
            ]
            if not chosen:
                return parser
            parser = chosen[0]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tsgate", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"tsgate {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway")
    add_arguments(serve)
    serve.set_defaults(func=_serve)
    schema = commands.add_parser(
        "schema", help="print or apply the Cassandra schema; give old index rows their TTL (expire-old-index)"
    )
    schema.add_argument("action", choices=["print", "apply", "expire-old-index"])
    schema.add_argument(
        "--max-ranges",
        type=int,
        metavar="N",
        help="expire-old-index: stop after N token ranges (of 256 a table); a run again continues there",
    )
    schema.add_argument(
        "--restart", action="store_true", help="expire-old-index: forget the progress kept and walk every table again"
    )
    add_arguments(schema, (*SCHEMA_SETTINGS, "overrides"))
    schema.set_defaults(func=_schema)
    downsample = commands.add_parser("downsample", help="roll up settled slots (see --once)")
    downsample.add_argument("--once", action="store_true", help="process everything settled now, then exit")
    add_arguments(downsample, DOWNSAMPLE_SETTINGS)
    downsample.set_defaults(func=_downsample)
    delete = commands.add_parser("delete", help="delete series and samples (Prometheus selectors or Graphite globs)")
    delete.add_argument("--tenant", default="default", help="the tenant whose series are deleted")
    delete.add_argument("--match", action="append", default=[], help="a Prometheus series selector (repeatable)")
    delete.add_argument(
        "--graphite", dest="patterns", action="append", default=[], help="a Graphite path or glob (repeatable)"
    )
    delete.add_argument("--start", help="first time deleted: epoch seconds or RFC 3339; default: the oldest")
    delete.add_argument("--end", help="last time deleted: epoch seconds or RFC 3339; default: the newest")
    delete.add_argument("--dry-run", action="store_true", help="print what would be deleted, delete nothing")
    add_arguments(delete, DELETE_SETTINGS)
    delete.set_defaults(func=_delete)
    importer = commands.add_parser("import", help="import data from another system (whisper)")
    sources = importer.add_subparsers(dest="source", required=True)
    whisper = sources.add_parser("whisper", help="import carbon's whisper files (*.wsp) under a directory")
    whisper.add_argument("directory", type=Path, help="the whisper tree (carbon's storage/whisper)")
    whisper.add_argument("--tenant", default="default", help="the tenant the series go to")
    whisper.add_argument("--prefix", default="", help="put before every path (P.a.b.c for a/b/c.wsp)")
    whisper.add_argument(
        "--workers",
        dest="import_workers",
        metavar="N",
        type=int,
        default=os.cpu_count() or 1,
        help="worker processes (default: the CPUs)",
    )
    whisper.add_argument(
        "--state-dir", type=Path, help="where the list of imported files is kept (default: <data-dir>/import-state)"
    )
    add_arguments(whisper, IMPORT_SETTINGS)
    whisper.set_defaults(func=_import_whisper)
    overrides = commands.add_parser("overrides", help="check a per-tenant overrides file (--overrides)")
    overrides.add_argument("action", choices=["check"])
    overrides.add_argument("file", type=Path, help="the overrides file (TOML)")
    add_arguments(overrides, OVERRIDES_SETTINGS)
    overrides.set_defaults(func=_overrides)
    auth = commands.add_parser(
        "auth", help="hash a bearer token or a password (read from stdin) into a line of an --auth-file"
    )
    auth.add_argument("action", choices=["hash-token", "hash-password"])
    auth.set_defaults(func=_auth)
    from gateway.app.devservices.cli import register

    register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    namespace = build_parser().parse_args(argv)
    try:
        return namespace.func(namespace)
    except ConfigError as error:
        print(f"tsgate {namespace.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
