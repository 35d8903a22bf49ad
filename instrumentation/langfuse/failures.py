"""Why a request to a backend failed, in one of six words: refused, timeout, unauthorized, server_error, rejected,
failed; and what to do about each, naming the variables to check.

Spoken by the one Langfuse client (a score it could not post, ``scores``) and by the guard around the network
exporters (``export.delivery``, which hears the cause through ``export.failures.OutcomeProbe``): it sits here, with
the client, because export sits above langfuse and the two must say the same thing about the same failure.

Pure classification: nothing here sends, waits or writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REFUSED, TIMEOUT, UNAUTHORIZED, SERVER_ERROR, REJECTED, FAILED = (
    "refused", "timeout", "unauthorized", "server_error", "rejected", "failed")

CAUSE_TEXT = {
    REFUSED: "connection refused or host not found",
    TIMEOUT: "no answer in time",
    UNAUTHORIZED: "credentials rejected",
    SERVER_ERROR: "server error",
    REJECTED: "request rejected",
    FAILED: "export failed",
}


@dataclass(frozen=True)
class Failure:
    """Why an export failed: one of the causes above and a short detail (a status, an error type; never a body)."""

    cause: str
    detail: str

    @property
    def definitive(self) -> bool:
        """Whether waiting longer cannot help: the exporter's own retries would only repeat the same answer."""
        return self.cause in (REFUSED, UNAUTHORIZED)


def failure_from_status(status: int) -> Failure:
    """The failure an HTTP status means (only called for 4xx and 5xx)."""
    if status in (401, 403):
        return Failure(UNAUTHORIZED, f"HTTP {status}")
    if status >= 500 or status == 429:
        return Failure(SERVER_ERROR, f"HTTP {status}")
    return Failure(REJECTED, f"HTTP {status}")


def failure_from_exception(error: BaseException) -> Failure:
    """The failure an exception raised by the HTTP client means."""
    from requests.exceptions import Timeout  # loaded by the HTTP exporters already; not needed before

    if isinstance(error, (Timeout, TimeoutError)):
        return Failure(TIMEOUT, type(error).__name__)
    if caused_by_refusal(error):
        return Failure(REFUSED, type(error).__name__)
    return Failure(FAILED, type(error).__name__)


def failure_from_grpc(code: Any, details: str = "") -> Failure:
    """The failure a gRPC status code (and its details text) means."""
    name = getattr(code, "name", str(code))
    if name in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        return Failure(UNAUTHORIZED, name)
    if name == "DEADLINE_EXCEEDED":
        return Failure(TIMEOUT, name)
    if name == "UNAVAILABLE":
        # gRPC says UNAVAILABLE both for "cannot connect" and for "server overloaded"; only the text tells them apart.
        connect = "connect" in details.lower() or "dns" in details.lower()
        return Failure(REFUSED if connect else SERVER_ERROR, name)
    if name in ("INVALID_ARGUMENT", "NOT_FOUND", "UNIMPLEMENTED", "FAILED_PRECONDITION", "OUT_OF_RANGE"):
        return Failure(REJECTED, name)
    return Failure(SERVER_ERROR, name)


def caused_by_refusal(error: BaseException) -> bool:
    """A refused connection or an unknown host, somewhere in requests' chain of wrapped errors.

    A reset of a pooled keep-alive connection is deliberately *not* a refusal: the exporter retries it at once and
    usually succeeds, so it must not end the wait early.
    """
    from urllib3.exceptions import NewConnectionError

    seen: set[int] = set()
    pending: list[Any] = [error]
    while pending:
        item = pending.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, (ConnectionRefusedError, NewConnectionError)):
            return True
        pending.extend([*item.args, getattr(item, "reason", None), item.__cause__, item.__context__])
    return False


def hint(backend: str, cause: str) -> str:
    """What to do about a failure, naming the variables to check (never their values)."""
    if cause == UNAUTHORIZED:
        return ("check LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY, and that LANGFUSE_BASE_URL is the host the keys "
                "belong to" if backend == "langfuse" else "check the credentials in OTEL_EXPORTER_OTLP_HEADERS")
    if cause == REFUSED:
        return (f"is {backend} running and reachable? "
                + ("set LANGFUSE_BASE_URL" if backend == "langfuse" else "set OTEL_EXPORTER_OTLP_ENDPOINT"))
    if cause == TIMEOUT:
        return ("the backend is slow or unreachable; raise LANGFUSE_TIMEOUT (seconds)" if backend == "langfuse" else
                "the backend is slow or unreachable; raise OTEL_EXPORTER_OTLP_TIMEOUT (milliseconds)")
    if cause == SERVER_ERROR:
        return "the backend is failing; try again later"
    if cause == REJECTED:
        return "the endpoint does not accept OTLP here: check the URL (and the protocol)"
    return "see the backend's logs"
