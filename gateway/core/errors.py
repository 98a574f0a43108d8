"""The gateway's error taxonomy: which base an error derives from says who must act, and so how
every HTTP API answers it (gateway/http/errors.py maps them, once).

- ClientError: the request is wrong; fixing it is the client's job (400, Prometheus's bad_data).
- LimitExceeded: the request is well formed but over a configured limit (422, execution; a
  subclass may answer 413 or 429).
- Unavailable: the gateway cannot answer now; the same request may work later (503, unavailable,
  with Retry-After).
- Timeout: the request ran past its deadline (503, timeout).

Anything else is a bug: 500 (internal), logged with its traceback. Deliberately free of imports
from the rest of the gateway, so any module may derive from these.
"""


class GatewayError(Exception):
    """The base of errors the gateway answers itself; subclasses set what the answer is."""

    status = 500
    error_type = "internal"  # Prometheus's errorType, which the other APIs do not show
    retry_after_s: int | None = None  # sent as Retry-After when set
    details: dict[str, object] = {}  # extra fields of the gateway's JSON answer, e.g. {"field": "from"}

    def answer_message(self) -> str:
        """What the client is told: the message itself unless a subclass introduces it."""
        return str(self)


class ClientError(GatewayError, ValueError):
    """Also a ValueError, as the parse errors that derive from it were before."""

    status = 400
    error_type = "bad_data"


class LimitExceeded(GatewayError):
    status = 422
    error_type = "execution"


class Unavailable(GatewayError):
    status = 503
    error_type = "unavailable"
    retry_after_s = 1


class Timeout(GatewayError):
    status = 503
    error_type = "timeout"


class StoreBusy(Unavailable):
    """The store, or the write path to it, cannot take the request now."""

    def answer_message(self) -> str:
        return f"the store cannot take this request now, retry later: {self}"
