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
write costs one scrypt per process, and scrypt runs in a thread, off the reactor.
docs/security.rst says how the roles map to endpoints.
"""

import base64
import binascii
import dataclasses
import hashlib
import hmac
import os
import tomllib
from pathlib import Path

from twisted.internet import threads

ROLES = ("write", "read", "admin")
_SCRYPT_N, _SCRYPT_R, _SCRYPT_P = 1 << 14, 8, 1


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

    def __init__(self, tokens: dict[str, Principal], users: dict[str, tuple[str, Principal]]):
        self.tokens = tokens
        self.users = users
        self._verified: dict[tuple[str, str], bool] = {}

    @classmethod
    def from_file(cls, path: Path) -> "Credentials":
        from gateway.model import InvalidSample, validate_tenant

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
        return cls(tokens, users)

    async def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization`` header value; Unauthorized when it names none."""
        if not authorization:
            raise Unauthorized("this endpoint needs a credential (basic auth or a bearer token)")
        scheme, _, value = authorization.strip().partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "bearer":
            principal = self.tokens.get(hash_token(value))
            if principal is None:
                raise Unauthorized("unknown bearer token")
            return principal
        if scheme == "basic":
            try:
                user, _, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise Unauthorized("basic auth value is not base64 of user:password") from None
            entry = self.users.get(user)
            if entry is None or not await self._password_matches(user, password, entry[0]):
                raise Unauthorized("wrong user or password")
            return entry[1]
        raise Unauthorized(f"authorization scheme {scheme!r} is not supported; use Basic or Bearer")

    async def _password_matches(self, user: str, password: str, stored: str) -> bool:
        key = (user, hash_token(password))
        known = self._verified.get(key)
        if known is None:
            known = await threads.deferToThread(verify_password, password, stored)
            if len(self._verified) >= 10_000:
                self._verified.clear()
            self._verified[key] = known
        return known
