"""Credentials (``--auth-file``): bearer tokens and basic-auth users, each bound to one tenant
and to the roles it may use (write, read, admin).

The file is TOML; secrets are stored hashed, never in clear (``tsgate auth hash-token`` and
``tsgate auth hash-password`` make the hashes)::

    [[tokens]]
    name = "prometheus-team-a"
    sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    tenant = "team-a"
    roles = ["write", "read"]

    [[users]]
    name = "grafana"
    password = "scrypt$16384$8$1$<salt>$<hash>"
    tenant = "team-a"
    roles = ["read"]

Tokens are long random strings, so one SHA-256 is enough to keep them from being usable if the
file leaks; passwords are chosen by people, so they get scrypt, which is slow on purpose. A
verified password is remembered (by its SHA-256) so Prometheus's basic auth on every remote
write costs one scrypt per process. Because scrypt is slow, password guessing is also a way to
load the gateway: scrypt runs in a small pool of its own (never the reactor's thread pool that
queries use) with a bounded queue, failed attempts are limited per client address and then per
user name (for addresses that failed lately, so one address's failures never lock a user out of
another), and an unknown user costs one scrypt like a wrong password, so timing does not tell
which user names exist. docs/security.rst says how the roles map to endpoints.
"""

import base64
import binascii
import dataclasses
import hashlib
import hmac
import math
import os
import time
import tomllib
from pathlib import Path

from twisted.internet import reactor, threads
from twisted.python.threadpool import ThreadPool

from gateway.ingest.limits import RateLimited

ROLES = ("write", "read", "admin")
_SCRYPT_N, _SCRYPT_R, _SCRYPT_P = 1 << 14, 8, 1
VERIFY_THREADS = 2  # scrypt releases the GIL: two checks at a time use two cores at most
MAX_WAITING_CHECKS = 32  # password checks queued for the pool; more are 429 at once
# An address that failed a credential this recently is held to the user name's allowance too;
# others are not, so a flood of wrong passwords from one address cannot lock the user out of another.
SUSPECT_ADDRESS_S = 600


class AuthFileError(ValueError):
    pass


class Unauthorized(Exception):
    """No credential, or one that is not in the file: 401."""


@dataclasses.dataclass(frozen=True)
class Principal:
    """Who a credential is: its name (for logs), its tenant and its roles."""

    name: str
    tenant: str
    roles: frozenset[str]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def hash_password(password: str) -> str:
    salt = os.urandom(16)
    digest = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=_SCRYPT_N, r=_SCRYPT_R, p=_SCRYPT_P)
    encode = lambda raw: base64.b64encode(raw).decode("ascii")  # noqa: E731
    return f"scrypt${_SCRYPT_N}${_SCRYPT_R}${_SCRYPT_P}${encode(salt)}${encode(digest)}"


def verify_password(password: str, stored: str) -> bool:
    """``stored`` was made by hash_password (its cost parameters are read from it)."""
    _, n, r, p, salt, digest = stored.split("$")
    expected = base64.b64decode(digest)
    actual = hashlib.scrypt(
        password.encode("utf-8"), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p), dklen=len(expected)
    )
    return hmac.compare_digest(actual, expected)


def _decoy_hash(stored_hashes) -> str:
    """A hash no password matches, with the costliest parameters of the file's: an unknown user
    is checked against it, so it costs what a wrong password costs."""
    n, r, p, length = max(
        (
            (int(n), int(r), int(p), len(base64.b64decode(digest)))
            for _, n, r, p, _, digest in (stored.split("$") for stored in stored_hashes)
        ),
        default=(_SCRYPT_N, _SCRYPT_R, _SCRYPT_P, 64),
    )
    encode = lambda raw: base64.b64encode(raw).decode("ascii")  # noqa: E731
    return f"scrypt${n}${r}${p}${encode(os.urandom(16))}${encode(os.urandom(length))}"


class FailureLimit:
    """Failed credential attempts per key (a user name, a client address): a bucket of
    ``per_minute`` attempts that refills over a minute. A key whose bucket is empty is refused
    (RateLimited, 429) before any password is checked. At most ``max_keys`` keys are kept (the
    oldest is forgotten first), so invented user names cannot fill the memory."""

    def __init__(self, per_minute: int, max_keys: int = 100_000, clock=time.monotonic):
        self.per_minute = per_minute
        self.max_keys = max_keys
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (attempts left, at)

    def _left(self, key: str, now: float) -> float:
        left, at = self._buckets.get(key, (self.per_minute, now))
        return min(self.per_minute, left + (now - at) * self.per_minute / 60)

    def check(self, *keys: str) -> None:
        if not self.per_minute:
            return
        now = self.clock()
        for key in keys:
            left = self._left(key, now)
            if left < 1:
                wait = math.ceil((1 - left) * 60 / self.per_minute)
                raise RateLimited(
                    f"too many failed credentials for {key} (--auth-max-failures {self.per_minute} a minute);"
                    f" retry in {wait}s",
                    wait,
                    "auth_failures",
                )

    def failed_within(self, key: str, seconds: float) -> bool:
        """Whether ``key`` failed in the last ``seconds`` (as far as the kept keys tell)."""
        entry = self._buckets.get(key)
        return entry is not None and self.clock() - entry[1] < seconds

    def failed(self, *keys: str) -> None:
        if not self.per_minute:
            return
        now = self.clock()
        for key in keys:
            left = self._left(key, now) - 1
            self._buckets.pop(key, None)  # re-inserted last: the dict stays oldest first
            if len(self._buckets) >= self.max_keys:
                del self._buckets[next(iter(self._buckets))]
            self._buckets[key] = (left, now)


def _check_password_hash(stored: str, where: str) -> None:
    parts = stored.split("$")
    try:
        valid = len(parts) == 6 and parts[0] == "scrypt" and all(int(x) > 0 for x in parts[1:4])
        valid = valid and all(base64.b64decode(x, validate=True) for x in parts[4:])
    except (ValueError, binascii.Error):
        valid = False
    if not valid:
        raise AuthFileError(f"{where}: password is not a hash made by `tsgate auth hash-password`")


class Credentials:
    """The parsed ``--auth-file``."""

    def __init__(
        self, tokens: dict[str, Principal], users: dict[str, tuple[str, Principal]], max_failures_per_minute: int = 0
    ):
        self.tokens = tokens
        self.users = users
        self.failures = FailureLimit(max_failures_per_minute)
        self._decoy = _decoy_hash(stored for stored, _ in users.values())
        self._verified: set[tuple[str, str]] = set()  # (user, SHA-256 of a password that matched)
        self._pool = ThreadPool(0, VERIFY_THREADS, name="password-checks")
        self._waiting = 0

    @classmethod
    def from_file(cls, path: Path, max_failures_per_minute: int = 0) -> "Credentials":
        from gateway.core.model import InvalidSample, validate_tenant

        try:
            document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
            raise AuthFileError(f"--auth-file {path}: {error}") from None
        tokens, users = {}, {}
        for section in ("tokens", "users"):
            for number, entry in enumerate(document.get(section, []), 1):
                where = f"--auth-file {path}: [[{section}]] #{number}"
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    raise AuthFileError(f"{where}: needs a name")
                roles = entry.get("roles", [])
                if not isinstance(roles, list) or not roles or set(roles) - set(ROLES):
                    raise AuthFileError(f"{where}: roles must be a non-empty list of {', '.join(ROLES)}")
                try:
                    tenant = validate_tenant(str(entry.get("tenant", "")))
                except InvalidSample as error:
                    raise AuthFileError(f"{where}: {error}") from None
                principal = Principal(entry["name"], tenant, frozenset(roles))
                if section == "tokens":
                    digest = str(entry.get("sha256", "")).lower()
                    if len(digest) != 64 or set(digest) - set("0123456789abcdef"):
                        raise AuthFileError(
                            f"{where}: sha256 must be the hex SHA-256 of the token (`tsgate auth hash-token`)"
                        )
                    tokens[digest] = principal
                else:
                    stored = str(entry.get("password", ""))
                    _check_password_hash(stored, where)
                    users[entry["name"]] = (stored, principal)
        if not tokens and not users:
            raise AuthFileError(f"--auth-file {path}: no [[tokens]] and no [[users]]")
        return cls(tokens, users, max_failures_per_minute)

    async def authenticate(self, authorization: str | None, client: str) -> Principal:
        """The principal of an ``Authorization`` header value sent from address ``client``;
        Unauthorized when it names none, RateLimited when too many failed before."""
        if not authorization:
            raise Unauthorized("this endpoint needs a credential (basic auth or a bearer token)")
        scheme, _, value = authorization.strip().partition(" ")
        scheme, value = scheme.lower(), value.strip()
        address = f"address {client}"
        if scheme == "bearer":
            principal = self.tokens.get(hash_token(value))
            if principal is None:
                self.failures.check(address)
                self.failures.failed(address)
                raise Unauthorized("unknown bearer token")
            return principal
        if scheme == "basic":
            try:
                user, _, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise Unauthorized("basic auth value is not base64 of user:password") from None
            known = (user, hash_token(password))
            if known in self._verified:
                return self.users[user][1]
            named = f"user {user[:100]!r}"
            self.failures.check(address)
            if self.failures.failed_within(address, SUSPECT_ADDRESS_S):
                self.failures.check(named)
            stored, principal = self.users.get(user, (self._decoy, None))
            if await self._verify(password, stored) and principal is not None:
                if len(self._verified) >= 10_000:
                    self._verified.clear()
                self._verified.add(known)
                return principal
            self.failures.failed(address, named)
            raise Unauthorized("wrong user or password")
        raise Unauthorized(f"authorization scheme {scheme!r} is not supported; use Basic or Bearer")

    async def _verify(self, password: str, stored: str) -> bool:
        """scrypt in the pool of password checks; RateLimited when too many already wait for it."""
        if self._waiting >= MAX_WAITING_CHECKS:
            raise RateLimited(
                f"{MAX_WAITING_CHECKS} password checks are already waiting; retry in 1s", 1, "auth_checks"
            )
        if not self._pool.started:
            self._pool.start()
            reactor.addSystemEventTrigger("during", "shutdown", self._pool.stop)  # type: ignore[arg-type]  # zope interface: see [tool.mypy]
        self._waiting += 1
        try:
            return await threads.deferToThreadPool(reactor, self._pool, verify_password, password, stored)
        finally:
            self._waiting -= 1
