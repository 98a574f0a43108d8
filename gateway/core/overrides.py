"""Per-tenant overrides: a runtime file (``--overrides FILE``, TOML) giving some tenants their own
ingest limits, query limits and retentions, reloaded without a restart (as Mimir's runtime config)::

    [tenants.noisy]
    tenant-max-active-series = 5000
    max-points-per-query = 1000000
    raw-retention = "2d"
    rollup-retention = { 5m = "7d" }

A tenant not in the file, and every key its section leaves out, take the flag's value. The file
is read at start-up (a bad one stops the start), then again when its modification time changes
(polled every POLL_INTERVAL_S) and on SIGHUP, in every gateway process (a ``--workers``
supervisor passes SIGHUP on to its workers); each gateway sends what it loaded to its query
executors, so they never disagree with it. A file that does not parse or
validate is refused whole: the last good one stays, one log line names the tenant, the key and
why, and ``tsgate_overrides_reload_failures_total`` counts it. So is a file without a ``tenants``
table (an empty one, as an editor or a config tool leaves it while it rewrites the file): no
tenant's values are dropped unless the file says so with ``tenants = {}``.

Retentions apply to what is written from then on; docs/operations.rst ("Per-tenant overrides")
says what becomes of data already written. ``--head-retention`` has no override: head rows must
outlive the downsampler's wait for every tenant alike.
"""

import dataclasses
import difflib
import logging
import os
import signal
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from twisted.internet.task import LoopingCall

from gateway.core import metrics
from gateway.core.layout import Layout, Retentions
from gateway.core.model import InvalidSample, validate_tenant
from protocols.timespec import parse_duration

if TYPE_CHECKING:  # the services that read limits must not depend on the settings module
    from gateway.app.config import Config

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 5.0


class TenantValue(NamedTuple):
    """How a setting is given per tenant in the file. gateway.app.config marks each per-tenant
    setting of its one table (SETTINGS) with one, and the file is checked from those marks:
    ``limit`` a whole number of at least ``minimum`` (0: no limit, where 0 is allowed),
    ``retention`` a duration string, ``rollups`` a table of retentions by granularity name,
    under ``key`` (the setting is --granularities), ``choice`` one of ``choices``, ``names`` a
    list of names (OTLP attributes)."""

    kind: str
    minimum: int = 0
    key: str = ""
    choices: tuple[str, ...] = ()


def tenant_limit(minimum: int) -> TenantValue:
    return TenantValue("limit", minimum)


TENANT_RETENTION = TenantValue("retention")
ROLLUP_KEY = "rollup-retention"
TENANT_ROLLUPS = TenantValue("rollups", key=ROLLUP_KEY)
# Why a file without a tenants table is refused, and how to give no tenant its own values.
NO_TENANTS = (
    "an empty file (one being rewritten, say) would drop every tenant's values;"
    " write `tenants = {}` to give no tenant values of its own"
)


def did_you_mean(word: str, choices) -> str:
    """`` (did you mean X?)`` for the closest of ``choices``, or nothing when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


class OverridesError(ValueError):
    """A file refused: the message names the tenant and the key, and why."""


def _limit(tenant: str, key: str, value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise OverridesError(f"tenant {tenant!r}: {key} = {value!r} is not a whole number")
    if value < minimum:
        raise OverridesError(f"tenant {tenant!r}: {key} = {value} must be {minimum} or more")
    return value


def _retention(tenant: str, key: str, value: object, longest_ms: int) -> int:
    """A duration string (``7d``), positive and no longer than the flags' longest retention: the
    read path and the stores never look further back than that."""
    if not isinstance(value, str):
        raise OverridesError(f'tenant {tenant!r}: {key} = {value!r} is not a duration string like "7d"')
    try:
        retention = parse_duration(value)
    except ValueError as error:
        raise OverridesError(f"tenant {tenant!r}: {key}: {error}") from None
    if retention <= 0:
        raise OverridesError(f"tenant {tenant!r}: {key} = {value!r} must be longer than 0s")
    if retention > longest_ms:
        raise OverridesError(
            f"tenant {tenant!r}: {key} = {value!r} is longer than the longest retention of the flags"
            f" ({longest_ms // 1000} s), which bounds every read"
        )
    return retention


def _tenant_section(tenant: str, section: object, layout: Layout, kinds: dict[str, TenantValue]) -> dict:
    """One tenant's keys, checked: ``{key: value}`` with durations in ms and roll-up retentions
    as ``{granularity name: ms}``."""
    try:
        validate_tenant(tenant)
    except InvalidSample as error:
        raise OverridesError(f"tenant {tenant!r}: {error.problem}") from None
    if not isinstance(section, dict):
        raise OverridesError(f"tenant {tenant!r}: expected a table of settings, got {section!r}")
    longest = layout.longest_retention_ms
    values: dict = {}
    for key, value in section.items():
        kind = kinds.get(key)
        if kind is None:
            raise OverridesError(f"tenant {tenant!r}: unknown key {key!r}{did_you_mean(key, kinds)}")
        if kind.kind == "limit":
            values[key] = _limit(tenant, key, value, kind.minimum)
        elif kind.kind == "retention":
            values[key] = _retention(tenant, key, value, longest)
        elif kind.kind == "choice":
            if value not in kind.choices:
                raise OverridesError(f"tenant {tenant!r}: {key} = {value!r} is not one of {', '.join(kind.choices)}")
            values[key] = value
        elif kind.kind == "names":
            if not isinstance(value, list) or not all(isinstance(name, str) and name for name in value):
                raise OverridesError(
                    f'tenant {tenant!r}: {key} must be a list of attribute names like ["k8s.pod.name"]'
                )
            values[key] = tuple(value)
        else:
            names = [g.name for g in layout.granularities]
            if not isinstance(value, dict):
                raise OverridesError(f'tenant {tenant!r}: {key} must be a table like {{ {names[0]} = "30d" }}')
            for name in value:
                if name not in names:
                    raise OverridesError(
                        f"tenant {tenant!r}: {key}: {name!r} is not one of --granularities ({', '.join(names)})"
                    )
            values[key] = {name: _retention(tenant, f"{key}.{name}", text, longest) for name, text in value.items()}
    return values


def parse_overrides(text: str, layout: Layout, kinds: dict[str, TenantValue]) -> dict[str, dict]:
    """The tenant sections of an overrides file, every value checked against ``kinds`` (the
    per-tenant settings by their key in the file); OverridesError otherwise."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise OverridesError(f"not TOML: {error}") from None
    for key in document:
        if key != "tenants":
            raise OverridesError(f"unknown top-level key {key!r}: tenant sections are [tenants.NAME]")
    if "tenants" not in document:
        raise OverridesError(f"no [tenants] table: {NO_TENANTS}")
    tenants = document["tenants"]
    if not isinstance(tenants, dict):
        raise OverridesError("tenants must be a table of [tenants.NAME] sections")
    return {tenant: _tenant_section(tenant, section, layout, kinds) for tenant, section in tenants.items()}


def defaults(config: "Config") -> dict:
    """Every tenant's values from the flags, keyed as in the file."""
    values: dict = {
        key: getattr(config, key.replace("-", "_"))
        for key, kind in config.tenant_values.items()
        if kind.kind != "rollups"
    }
    values[ROLLUP_KEY] = {g.name: g.retention_ms for g in config.layout.granularities}
    return values


class PerTenant:
    """One limit's value for each tenant, and the setting to name in a refusal: the flag, or the
    overrides file for a tenant it gives its own value. Without ``overrides``: ``value`` for all."""

    def __init__(self, key: str, value: int, overrides: "Overrides | None" = None):
        self.key = key
        self.value = value
        self.overrides = overrides

    def __call__(self, tenant: str) -> int:
        return self.value if self.overrides is None else self.overrides.for_tenant(tenant)[self.key]

    def setting(self, tenant: str) -> str:
        if self.overrides is not None and self.key in self.overrides.by_tenant.get(tenant, {}):
            return f"{self.key} of tenant {tenant!r} in --overrides"
        return f"--{self.key}"

    def anywhere(self) -> bool:
        """Whether the limit is on (not 0) for some tenant."""
        return bool(self.value) if self.overrides is None else self.key in self.overrides.on_somewhere


def per_tenant(key: str, value: "int | PerTenant") -> PerTenant:
    """``value`` as a PerTenant: a plain number is the same for every tenant."""
    return value if isinstance(value, PerTenant) else PerTenant(key, value)


class Overrides:
    """The effective values of each tenant, from the flags and the last good overrides file."""

    def __init__(self, config: "Config", clock: Callable[[], float] = time.time):
        self.path: Path | None = config.overrides
        self.layout = config.layout
        self.kinds: dict[str, TenantValue] = config.tenant_values
        self.limits = [key for key, kind in self.kinds.items() if kind.kind == "limit"]
        self.defaults = defaults(config)
        self.clock = clock
        self.by_tenant: dict[str, dict] = {}  # only the keys each tenant's section sets
        self.effective: dict[str, dict] = {}
        self.retentions = Retentions(self.layout)
        self.on_somewhere = {key for key in self.limits if self.defaults[key]}  # limits not 0 for some tenant
        self.loaded_at: float | None = None
        self._seen: tuple[int, int] | None = None  # (mtime ns, size) of the file last read

    def load(self) -> None:
        """Read the file (at start-up); OverridesError names what is wrong."""
        if self.path is None:
            return
        self._seen = _stamp(self.path)
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as error:
            raise OverridesError(f"cannot read it: {error.strerror}") from None
        self.use(parse_overrides(text, self.layout, self.kinds))

    def reload(self, why: str = "SIGHUP") -> bool:
        """Read the file again; a bad one is logged and counted, and the last good one stays."""
        if self.path is None:
            return False
        try:
            self.load()
        except OverridesError as error:
            metrics.OVERRIDES_RELOAD_FAILURES.inc()
            log.error("--overrides %s refused (%s), keeping the last good one: %s", self.path, why, error)
            return False
        log.info("--overrides %s reloaded (%s): %d tenants with their own values", self.path, why, len(self.by_tenant))
        return True

    def changed(self) -> bool:
        """Whether the file's modification time or size changed since it was last read."""
        return self.path is not None and _stamp(self.path) != self._seen

    def use(self, by_tenant: dict[str, dict]) -> None:
        """Take checked tenant sections (``parse_overrides``; a query executor gets its gateway's)."""
        effective = {}
        for tenant, values in by_tenant.items():
            merged = {**self.defaults, **values}
            merged[ROLLUP_KEY] = {**self.defaults[ROLLUP_KEY], **values.get(ROLLUP_KEY, {})}
            effective[tenant] = merged
        self.by_tenant, self.effective = by_tenant, effective
        self.on_somewhere = {key for key in self.limits if any(v[key] for v in (self.defaults, *effective.values()))}
        self.retentions.by_tenant = {
            tenant: self._layout(values)
            for tenant, values in effective.items()
            if self._sets_retention(by_tenant[tenant])
        }
        self.loaded_at = self.clock()
        metrics.OVERRIDES_LOADED_AT.set(self.loaded_at)

    def _layout(self, values: dict) -> Layout:
        granularities = tuple(g._replace(retention_ms=values[ROLLUP_KEY][g.name]) for g in self.layout.granularities)
        return dataclasses.replace(
            self.layout,
            raw_retention_ms=values["raw-retention"],
            exemplar_retention_ms=values["exemplar-retention"],
            granularities=granularities,
        )

    def for_tenant(self, tenant: str) -> dict:
        return self.effective.get(tenant, self.defaults)

    def limit(self, key: str) -> PerTenant:
        return PerTenant(key, self.defaults[key], self)

    def shown(self) -> dict:
        """What GET /api/v1/admin/overrides answers: the defaults and each listed tenant's values."""
        return {
            "file": str(self.path) if self.path is not None else None,
            "loaded_at": self.loaded_at,
            "defaults": self._readable(self.defaults),
            "tenants": {tenant: self._readable(values) for tenant, values in sorted(self.effective.items())},
            "overridden": {tenant: sorted(values) for tenant, values in sorted(self.by_tenant.items())},
        }

    def _sets_retention(self, values: dict) -> bool:
        return any(self.kinds[key].kind in ("retention", "rollups") for key in values)

    def _readable(self, values: dict) -> dict:
        """Each value as the file writes it: retentions as ``7d``, names as a list."""
        shown: dict = {}
        for key, kind in self.kinds.items():
            if kind.kind == "retention":
                shown[key] = duration_text(values[key])
            elif kind.kind == "rollups":
                shown[key] = {name: duration_text(ms) for name, ms in values[key].items()}
            elif kind.kind == "names":
                shown[key] = list(values[key])
            else:
                shown[key] = values[key]
        return shown


class OverridesWatch:
    """Reloads the file when it changes (a stat every POLL_INTERVAL_S) and on SIGHUP, then calls
    ``reloaded`` after each good load (the gateway passes it on to its query executors)."""

    def __init__(self, overrides: Overrides, reloaded: Callable[[], None]):
        self.overrides = overrides
        self.reloaded = reloaded
        self.poll = LoopingCall(self._check)

    def start(self) -> None:
        """SIGHUP is taken over even without a file (then it does nothing): it no longer stops the gateway."""
        from twisted.internet import reactor

        signal.signal(signal.SIGHUP, lambda signum, frame: reactor.callFromThread(self._reload))
        if self.overrides.path is not None:
            self.poll.start(POLL_INTERVAL_S, now=False)

    def stop(self) -> None:
        if self.poll.running:
            self.poll.stop()

    def _reload(self) -> None:
        if self.overrides.reload("SIGHUP"):
            self.reloaded()

    def _check(self) -> None:
        if self.overrides.changed() and self.overrides.reload("file changed"):
            self.reloaded()


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size


def duration_text(milliseconds: int) -> str:
    """``604800000`` -> ``7d``: the largest unit that divides it (as the file and the flags write it)."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if milliseconds % size == 0:
            return f"{milliseconds // size}{unit}"
    return f"{milliseconds}ms"
