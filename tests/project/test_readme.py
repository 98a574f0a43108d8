"""README.rst, followed as a newcomer follows it: every ``$ command`` of its literal blocks runs in
order, in one fresh directory, against a fresh gateway started as the README starts it, and
prints what the README shows. So the README cannot drift from what tsgate does.

What the runner does that the reader does by hand: ``tsgate`` is this clone's (a wrapper on the
PATH, not a virtualenv); ``tsgate serve ...`` starts the gateway in the background on free ports
(stopping the one before: the README restarts it), and the commands' ports 8080, 2003 and 2004
are rewritten to those. ``curl``, ``openssl`` and ``promtool`` (Debian's prometheus package, as
the other Prometheus tests need) must be installed: ``.ci/run`` installs them. Outputs are compared with whitespace collapsed (the README wraps long
JSON), epoch times, SHA-256 hex and scrypt hashes masked, and a ``...`` line in the README
standing for any lines (HTTP headers). A command printing nothing must print nothing.

A block is skipped only after a ``.. tsgate-readme-test: skip (why)`` comment, and only the blocks
listed in SKIPPED may be: each needs something a fresh clone's test run does not have.
"""

import os
import re
import shlex
import stat
import subprocess
import sys
from typing import NamedTuple

import pytest

from tests.gatewayproc import REPO, GatewayProcess

SKIP_MARKER = re.compile(r"^\.\. tsgate-readme-test: skip \((.+)\)\s*$")

# The README's skipped blocks, by the first command of each, and why they cannot run here.
SKIPPED = {
    "python3 -m venv .venv": "installing into a virtualenv downloads every dependency; the test runs this clone",
    "tsgate schema apply --store cassandra://127.0.0.1/tsdb": (
        "needs Cassandra on 9042 and Redis on 6379; tests/store/test_cassandra.py and the end-to-end tests cover them"
    ),
    "tsgate schema apply --store cassandra://cass1,cass2,cass3/tsdb --replication NetworkTopologyStrategy:dc1=3": (
        "needs a 3-node Cassandra cluster; tests/e2e/test_cluster.py runs these settings on one"
    ),
}

MASKS = [
    (re.compile(r"\b1\d{9}(\.\d+)?\b"), "<epoch>"),
    (re.compile(r"\b[0-9a-f]{64}\b"), "<sha256>"),
    (re.compile(r"scrypt\$[^\"\s]+"), "<scrypt>"),
]


class Step(NamedTuple):
    command: str
    expected: list[str]
    skipped: bool


def literal_blocks(text: str):
    """(skip reason or None, dedented lines) of each literal block (``::`` then an indented block)."""
    lines = text.splitlines()
    skip = None
    index = 0
    while index < len(lines):
        line = lines[index]
        marker = SKIP_MARKER.match(line)
        if marker:
            skip = marker.group(1)
        index += 1
        if not line.rstrip().endswith("::") or line.startswith(".. "):
            continue
        block = []
        while index < len(lines) and (not lines[index].strip() or lines[index][0].isspace()):
            block.append(lines[index])
            index += 1
        indent = min(len(b) - len(b.lstrip()) for b in block if b.strip()) if any(map(str.strip, block)) else 0
        body = [b[indent:] for b in block]
        while body and not body[0].strip():
            body.pop(0)
        while body and not body[-1].strip():
            body.pop()
        if any(b.startswith("$ ") for b in body):
            yield skip, body
            skip = None


def _incomplete(command: str) -> bool:
    """An open quote or a trailing backslash: the command goes on on the next line."""
    if command.endswith("\\"):
        return True
    try:
        shlex.split(command)
    except ValueError:
        return True
    return False


def steps(text: str) -> list[Step]:
    found = []
    for skip, lines in literal_blocks(text):
        index = 0
        while index < len(lines):
            assert lines[index].startswith("$ "), f"output before any command: {lines[index]!r}"
            command = lines[index][2:]
            index += 1
            heredoc = re.search(r"<<\s*'?(\w+)'?", command)
            if heredoc:
                while lines[index] != heredoc.group(1):
                    command += "\n" + lines[index]
                    index += 1
                command += "\n" + lines[index]
                index += 1
            else:
                while _incomplete(command):
                    command += "\n" + lines[index]
                    index += 1
            expected = []
            while index < len(lines) and not lines[index].startswith("$ "):
                expected.append(lines[index])
                index += 1
            found.append(Step(command, expected, skip is not None))
    return found


def normalize(text: str) -> str:
    text = " ".join(text.split())
    for pattern, replacement in MASKS:
        text = pattern.sub(replacement, text)
    return text


def matches(expected: list[str], actual: str) -> bool:
    """``actual`` is what ``expected`` shows, a ``...`` line standing for any lines."""
    segments, current = [], []
    for line in expected:
        if line.strip() == "...":
            segments.append(current)
            current = []
        else:
            current.append(line)
    segments.append(current)
    pattern = r"\s*.*?\s*".join(re.escape(normalize("\n".join(segment))) for segment in segments)
    return re.fullmatch(pattern, normalize(actual), re.DOTALL) is not None


def test_the_readme_parser_reads_commands_outputs_and_heredocs():
    text = """Intro::

    $ echo '{"a":
        1}'
    {"a": 1}
    $ cat > f <<EOF
    x

    y
    EOF
    $ true

.. tsgate-readme-test: skip (why)

Then::

    $ nothing here
    out
"""
    assert steps(text) == [
        Step("""echo '{"a":\n    1}'""", ['{"a": 1}'], False),
        Step("cat > f <<EOF\nx\n\ny\nEOF", [], False),
        Step("true", [], False),
        Step("nothing here", ["out"], True),
    ]
    assert matches(["HTTP/1.1 400 Bad", "...", '{"a":', " 1}"], 'HTTP/1.1 400 Bad\r\nDate: x\r\n\r\n{"a": 1}')
    assert not matches(["[]"], '["x"]') and matches([], "") and not matches([], "something")
    assert matches(["t 1763640000.5"], "t 1795634707.639")


@pytest.mark.slow
def test_every_readme_command_prints_what_the_readme_shows(tmp_path):
    readme = (REPO / "README.rst").read_text(encoding="utf-8")
    skipped_blocks = [lines[0][2:] for skip, lines in literal_blocks(readme) if skip]
    assert skipped_blocks == list(SKIPPED), "only the blocks listed in SKIPPED may be skipped, and each must be"
    all_steps = steps(readme)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "tsgate"
    wrapper.write_text(
        f'#!/bin/sh\nPYTHONPATH={shlex.quote(str(REPO))} exec {sys.executable} -m gateway.app.cli "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    workdir = tmp_path / "newcomer"
    workdir.mkdir()
    environment = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    gateway = None
    ran = 0
    try:
        for step in all_steps:
            if step.skipped:
                continue
            words = shlex.split(step.command)
            if words[:2] == ["tsgate", "serve"]:
                assert not step.expected, "tsgate serve stays in the foreground: the README shows no output for it"
                if gateway is not None:
                    assert gateway.stop() == 0
                gateway = GatewayProcess(workdir, *words[2:]).start()
                ran += 1
                continue
            command = step.command
            if gateway is not None:
                for readme_port, port in (
                    (8080, gateway.port),
                    (2003, gateway.graphite_port),
                    (2004, gateway.pickle_port),
                ):
                    command = re.sub(rf"\b{readme_port}\b", str(port), command)
            result = subprocess.run(
                ["bash", "-c", command], cwd=workdir, env=environment, capture_output=True, text=True, timeout=60
            )
            assert result.returncode == 0, f"$ {step.command}\nexit {result.returncode}: {result.stderr}"
            shown = "\n".join(step.expected)
            assert matches(step.expected, result.stdout), (
                f"$ {step.command}\nREADME shows:\n{shown}\nprinted:\n{result.stdout}"
            )
            ran += 1
    finally:
        if gateway is not None:
            assert gateway.stop() == 0
    assert ran >= 20  # the README's examples, not an empty parse


def test_the_skipped_schema_apply_blocks_show_the_statement_count_of_a_fresh_keyspace():
    """The Cassandra blocks cannot run here: what ``schema apply`` prints for a new keyspace (the
    keyspace, every table statement and every upgrade statement, none of which is an ALTER then)
    is counted from the code instead."""
    from gateway.core.layout import Layout
    from gateway.store.cassandra import parse_url
    from gateway.store.cassandra_schema import table_statements, upgrade_statements

    schema = parse_url("cassandra://127.0.0.1/tsdb", Layout()).schema
    count = 1 + len(table_statements(schema)) + len(upgrade_statements(schema))
    readme = (REPO / "README.rst").read_text(encoding="utf-8")
    shown = [step.expected for step in steps(readme) if step.command.startswith("tsgate schema apply")]
    assert shown == [[f"schema applied: keyspace tsdb, {count} statements", "-- the time index holds every series"]] * 2
