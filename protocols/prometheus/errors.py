"""Errors carrying the HTTP status a server should answer with."""


class ProtocolError(Exception):
    """A request that cannot be accepted; `status` is the HTTP status to send."""

    def __init__(self, status: int, message: str):
        super().__init__(status, message)
        self.status = status
        self.message = message

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"


class RemoteWriteError(ProtocolError):
    """Rejected remote write request (400, 413 or 415)."""


class RemoteReadError(ProtocolError):
    """Rejected remote read request (400 or 413)."""
