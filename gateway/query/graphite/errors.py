"""The render engine's user-error types and the longest series a render may build.

A module of its own so that the fetcher raises them without loading the function library.
"""

from gateway.core.errors import ClientError

# A render (or a function such as linearRegression reaching back to epoch 0) must not build
# unbounded lists on the reactor.
MAX_POINTS_PER_SERIES = 1_000_000


class RenderError(ClientError):
    """A user error in a target (syntax, unknown function, bad argument): an HTTP 400."""


class EmptyResult(Exception):
    """Raised when there is nothing to normalize; the calling function then returns []."""
