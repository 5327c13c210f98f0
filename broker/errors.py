"""One error tree for the broker boundary; every REST error is one of these, in one shape.

    FirepoolError                 class name = the wire `class`, `status` = HTTP status
    ├── InvalidRequest (422)      ├── UnknownField (422)   └── UnknownPool (400), Unschedulable (400)
    ├── ImageNotAllowed (403: not in the pool's allowlist)  ImagesUnsupported (400: backend runs no images)
    ├── Unauthorized (401)        ├── NotFound (404)       └── Conflict (409)
    │                                 └── KernelNotReady (409, retryable), KernelEnded (409), NotAKernel (409)
    ├── PackageError (4xx)        └── QuotaExceeded (429)   └── TooManyKernels, TooManyOpenRequests (429)
    │   ├── UnsafePackage (400: symlink, absolute, `..`, special file)   ├── DigestMismatch (400)
    │   └── PayloadTooLarge (413: compressed or extracted limit)
    ├── Unavailable (503, retryable)   StoreError (503, retryable)   BackendError (502, retryable)
    │   └── NotLeader (503: a standby)  └── Fenced (an old term's write)
    │   └── StreamBroken (the SDK's own: a stream's broker went away mid-way)
    │                                  └── AgentError, PortClosed (502: nothing serves the port)
    └── at the API's door: MethodNotAllowed (405), RequestTooLarge (413), UnsupportedMediaType (415),
        InternalError (500: an unhandled exception, logged with its traceback)

Adapters translate library errors (SQLAlchemy, httpx, kubernetes) into these with `raise ... from`.
The SDK maps the wire `class` back to the same names, so callers switch on one vocabulary.
"""

from __future__ import annotations

from typing import Any


class FirepoolError(Exception):
    """Base of every error the broker reports to a caller."""

    status: int = 500
    retryable: bool = False

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}

    @property
    def error_class(self) -> str:
        return type(self).__name__

    def to_wire(self) -> dict[str, Any]:
        """The one error shape: {"error": {"class", "message", "retryable", "details"}}."""
        return {
            "error": {
                "class": self.error_class,
                "message": self.message,
                "retryable": self.retryable,
                "details": self.details,
            }
        }


class InvalidRequest(FirepoolError):
    status = 422


class UnknownField(InvalidRequest):
    status = 422


class UnknownPool(FirepoolError):
    status = 400


class Unschedulable(FirepoolError):
    """The request can never be placed (e.g. more pods than the pool's ceiling)."""

    status = 400


class ImageNotAllowed(FirepoolError):
    """The job names a custom image its pool's `images` allowlist does not match."""

    status = 403


class ImagesUnsupported(FirepoolError):
    """The backend cannot run a job's custom image (the local backend has no container runtime)."""

    status = 400


class Unauthorized(FirepoolError):
    status = 401


class Forbidden(FirepoolError):
    """A verified caller asked for what only an admin caller may see."""

    status = 403


class NotFound(FirepoolError):
    status = 404


class Conflict(FirepoolError):
    status = 409


class LogsSwept(FirepoolError):
    """The job's logs were removed by log retention (past its age, or its caller's bytes)."""

    status = 410


class KernelNotReady(Conflict):
    """The kernel job has no reachable kernel yet (queued, starting): ask again, or with `wait_s`."""

    retryable = True


class KernelEnded(Conflict):
    """The kernel job ended: its kernel is gone, and so are its keys."""


class NotAKernel(Conflict):
    """The job was not submitted with `kernel: true`: it has no kernel connection."""


class PackageError(FirepoolError):
    status = 400


class PayloadTooLarge(PackageError):
    status = 413


class UnsafePackage(PackageError):
    """An archive entry that could escape or subvert the package directory."""

    status = 400


class DigestMismatch(PackageError):
    """The body's SHA-256 is not the digest the request named."""

    status = 400


class QuotaExceeded(FirepoolError):
    status = 429
    retryable = True


class Unavailable(FirepoolError):
    status = 503
    retryable = True


class NotLeader(Unavailable):
    """This broker is a hot standby: details name the leader's URL (or null while none leads) and the term."""


class StreamBroken(Unavailable):
    """The SDK's side only: a streamed answer (a log followed, a command's events) lost its broker mid-way, e.g.
    when the leader died. Streams are not resumed on another broker; what they showed is durable (ask again)."""


class StoreError(FirepoolError):
    status = 503
    retryable = True


class Fenced(StoreError):
    """A write of a term that is no longer the newest: another broker leads now, this one must stop."""


class BackendError(FirepoolError):
    status = 502
    retryable = True


class AgentError(BackendError):
    """A pod agent could not be reached or refused a request."""


class PortClosed(BackendError):
    """Nothing in the session's sandbox serves the port (yet): retryable, a server may be starting."""


class MethodNotAllowed(FirepoolError):
    """The route exists but not for this method; the response's `Allow` header lists those it serves."""

    status = 405


class RequestTooLarge(FirepoolError):
    """A JSON request body over the broker's `--max-request-bytes`."""

    status = 413


class UnsupportedMediaType(FirepoolError):
    status = 415


class InternalError(FirepoolError):
    """A bug: an exception no handler expected (the broker log has the traceback)."""

    status = 500


def all_error_classes() -> dict[str, type[FirepoolError]]:
    """Every error class by wire name, for the SDK's reverse mapping."""
    found: dict[str, type[FirepoolError]] = {}
    stack: list[type[FirepoolError]] = [FirepoolError]
    while stack:
        cls = stack.pop()
        found[cls.__name__] = cls
        stack.extend(cls.__subclasses__())
    return found


class TooManyKernels(QuotaExceeded):
    """The caller already runs the gateway's per-caller number of kernels: shut one down first."""


class TooManyOpenRequests(QuotaExceeded):
    """The caller holds the broker's per-caller number of requests and websockets open (`--max-open-requests`)."""


class SessionBusy(Conflict):
    """Another live gateway kernel of the caller holds this session (a session runs one job at a time)."""
