"""The ``loop_anomaly`` score on a run's trace in Langfuse, and the queue that posts scores off the agent's thread.

Every score goes through Langfuse's public API client (``api.LangfuseAPI``), the one client looptrace has for
Langfuse: the live path (``LangfuseScores``), ``looptrace watch`` and the scan of stored traces (``scan``)
build their bodies with ``anomaly_score_body`` and post them with ``post_score``. One score is one JSON object, the
form every Langfuse version accepts. Each score's id is derived from what it says, so posting it again (a retry, a
second run of the same code on the same trace, a scan after the live run) updates it instead of adding a duplicate.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from ..detector import LoopCost, format_usd
from ..logs import log
from ..settings import LangfuseSettings, safe_url
from .api import SCORES_PATH, LangfuseAPI, LangfuseAPIError, RetryPolicy
from .failures import Failure, failure_from_exception, failure_from_status
from .mapping import (
    ANOMALY_SCORE,
    DEFAULT_ENVIRONMENT,
    LOOP_COST_SCORE,
    LOOPED_SCORE,
    MAX_STATUS_MESSAGE_CHARS,
    run_environment,
)

__all__ = ["ANOMALY_SCORE", "LOOPED_SCORE", "LOOP_COST_SCORE", "LangfuseScores", "anomaly_score_body",
           "loop_cost_score_body", "looped_score_body", "post_score", "stable_score_id"]

_STOP = object()
_ONE_ATTEMPT = RetryPolicy(max_attempts=1, max_retries=0)  # the queue never waits on a backend: a failure is said once


def stable_score_id(trace_id: str, name: str, value: Any, observation_id: str | None = None) -> str:
    """A score's id, the same whoever posts it (a live run, watch, a scan): a second post updates, never adds."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"looptrace:{trace_id}:{observation_id or ''}:{name}:{value}"))


def anomaly_score_body(trace_id: str, anomaly_type: str, message: str, *, span_id: str | None = None,
                       environment: str | None = None, cost: LoopCost | None = None) -> dict[str, Any]:
    """The score that marks a run with a loop anomaly, as the scores API takes it: categorical ``loop_anomaly`` = the
    anomaly type, on the trace (so the traces table can filter on it and an alert can count it), one per type and
    trace, with the detector's message as the comment and the id of the span that reported it (the run's root) in
    the metadata; filed in ``environment`` unless that is Langfuse's default one. With the loop's ``cost`` (when it
    was reported), the comment begins with it and the metadata holds its figures."""
    comment = message if cost is None else f"{cost_sentence(cost)} {message}"
    body: dict[str, Any] = {"id": stable_score_id(trace_id, ANOMALY_SCORE, anomaly_type), "traceId": trace_id,
                            "name": ANOMALY_SCORE, "value": anomaly_type, "dataType": "CATEGORICAL",
                            "comment": comment[:MAX_STATUS_MESSAGE_CHARS]}
    metadata: dict[str, Any] = {}
    if span_id:
        metadata["span_id"] = span_id
    if cost is not None:
        metadata["loop_cost"] = dict(cost.to_dict())
    if metadata:
        body["metadata"] = metadata
    return _filed(body, environment)


def cost_sentence(cost: LoopCost) -> str:
    """"Loop cost so far: 4 turns, 18,400 tokens (17,900 in, 500 out), $0.3800." (no USD without a price, and why)"""
    money = format_usd(cost.usd) if cost.usd is not None else f"USD unknown: {cost.unpriced or 'no price'}"
    return (f"Loop cost so far: {cost.turns} turn{'s' if cost.turns != 1 else ''}, {cost.total_tokens:,} tokens "
            f"({cost.input_tokens:,} in, {cost.output_tokens:,} out), {money}.")


def loop_cost_score_body(trace_id: str, anomaly_type: str, cost: LoopCost, *, span_id: str | None = None,
                         environment: str | None = None) -> dict[str, Any] | None:
    """The numeric ``loop_cost_usd`` score of a run: what the turns its ``anomaly_type`` loops first found cost (the
    run's scores of every type add up to its loop cost, each turn counted once), so a Langfuse alert can sum it over
    a window. None without a price: a score of 0 would read as a free loop."""
    if cost.usd is None:
        return None
    metadata: dict[str, Any] = {"anomaly_type": anomaly_type, "loop_cost": dict(cost.to_dict())}
    if span_id:
        metadata["span_id"] = span_id
    body = {"id": stable_score_id(trace_id, LOOP_COST_SCORE, anomaly_type), "traceId": trace_id,
            "name": LOOP_COST_SCORE, "value": cost.usd, "dataType": "NUMERIC",
            "comment": f"{anomaly_type}: {cost_sentence(cost)}"[:MAX_STATUS_MESSAGE_CHARS], "metadata": metadata}
    return _filed(body, environment)


def looped_score_body(trace_id: str, looped: bool, *, environment: str | None = None) -> dict[str, Any]:
    """The boolean ``looped`` score every run gets as it ends: a Langfuse alert on its average over a window is the
    share of runs that looped (Langfuse averages a boolean score as the share of true values)."""
    body = {"id": stable_score_id(trace_id, LOOPED_SCORE, "run"), "traceId": trace_id, "name": LOOPED_SCORE,
            "value": 1 if looped else 0, "dataType": "BOOLEAN"}
    return _filed(body, environment)


def _filed(body: dict[str, Any], environment: str | None) -> dict[str, Any]:
    if environment and environment != DEFAULT_ENVIRONMENT:
        body["environment"] = environment
    return body


def post_score(api: LangfuseAPI, body: Mapping[str, Any]) -> Failure | None:
    """Post one score now, on this thread: None when Langfuse took it, else why not (``failures.Failure``: a cause
    a caller may retry on, or one that waiting cannot fix). Never raises for what the server or network does."""
    try:
        api.post_score(body)
    except LangfuseAPIError as error:
        if error.transport is not None:
            return failure_from_exception(error.transport)
        return failure_from_status(error.status if error.status is not None else 500)
    except Exception as error:  # noqa: BLE001 - classified, never raised: a score must not fail what posts it
        return failure_from_exception(error)
    return None


class LangfuseScores:
    """Sends scores to Langfuse's public REST API (``POST /api/public/scores``), off the caller's thread.

    ``send`` never blocks and never raises; failures end as one warning per cause. ``flush(timeout_s)`` waits, at most
    that long, for the queue to drain; ``close(timeout_s)`` flushes and stops the worker (a later score starts it
    again). One instance serves every run of the telemetry that built it (``alerts.anomaly_sinks``).
    """

    def __init__(self, base_url: str, public_key: str, secret_key: str, *, timeout_s: float = 5.0,
                 environment: str | None = None) -> None:
        # Scores go to the environment of the run's observations, or environment-filtered views would miss them.
        self.environment = environment
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + SCORES_PATH
        self.timeout_s = timeout_s
        self._keys = (public_key, secret_key)
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self.sent = 0
        # Where a score Langfuse could not take goes (the undelivered list's keep_score), for `looptrace traces push`.
        self.keep_undelivered: Callable[[Mapping[str, Any]], None] | None = None

    def __repr__(self) -> str:
        return f"LangfuseScores({safe_url(self.base_url)!r})"

    @classmethod
    def from_settings(cls, settings: LangfuseSettings, *, resource: Any, timeout_s: float | None = None
                      ) -> LangfuseScores:
        """Scores for the project of ``settings``, filed in the environment of the runs' observations: ``resource``
        is the tracer provider's resource, or the resource attributes (``Settings.resource_attributes``)."""
        attributes: Mapping[str, Any] = getattr(resource, "attributes", resource)
        return cls(settings.base_url, settings.public_key, settings.secret_key,
                   timeout_s=timeout_s if timeout_s is not None else min(settings.timeout_s, 5.0),
                   environment=run_environment(settings, attributes))

    def client(self) -> LangfuseAPI:
        """A client for this project that tries each request once (a caller that retries decides when)."""
        return LangfuseAPI(self.base_url, *self._keys, timeout_s=self.timeout_s, retry=_ONE_ATTEMPT)

    def send(self, trace_id: str, *, name: str, value: float | str, comment: str | None = None,
             data_type: str | None = None, observation_id: str | None = None, score_id: str | None = None,
             metadata: Mapping[str, Any] | None = None) -> str:
        """Queue one score on a trace (or on one observation of it); returns the score id.

        ``data_type`` is NUMERIC, BOOLEAN or CATEGORICAL (then ``value`` is a string); Langfuse assumes NUMERIC.
        Only fields of the API's CreateScoreRequest are sent; the deterministic id alone makes a retry an update.
        """
        body: dict[str, Any] = {"id": score_id or stable_score_id(trace_id, name, value, observation_id),
                                "traceId": trace_id, "name": name, "value": value}
        for key, item in (("observationId", observation_id), ("comment", comment), ("dataType", data_type),
                          ("metadata", dict(metadata) if metadata else None), ("environment", self.environment)):
            if item is not None:
                body[key] = item
        return self._enqueue(body)

    def anomaly(self, trace_id: str, anomaly_type: str, message: str, *, span_id: str | None = None,
                cost: LoopCost | None = None) -> str:
        """The score that marks a run with a loop anomaly (``anomaly_score_body``), queued."""
        return self._enqueue(anomaly_score_body(trace_id, anomaly_type, message, span_id=span_id,
                                                environment=self.environment, cost=cost))

    def run_ended(self, trace_id: str, loop_cost_by_type: Mapping[str, LoopCost], *,
                  span_id: str | None = None) -> None:
        """The scores a run gets as it ends: ``looped`` (true or false) and a ``loop_cost_usd`` per anomaly type."""
        self._enqueue(looped_score_body(trace_id, bool(loop_cost_by_type), environment=self.environment))
        for anomaly_type, cost in loop_cost_by_type.items():
            body = loop_cost_score_body(trace_id, anomaly_type, cost, span_id=span_id, environment=self.environment)
            if body is not None:
                self._enqueue(body)

    def _enqueue(self, body: dict[str, Any]) -> str:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="looptrace-langfuse-scores", daemon=True)
                self._thread.start()
            self._queue.put(body)
        return str(body["id"])

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued score was sent or failed, at most ``timeout_s``. True when the queue drained."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self, timeout_s: float = 5.0) -> bool:
        """Send what is queued, within ``timeout_s``, and stop the worker."""
        drained = self.flush(timeout_s)
        with self._lock:
            if self._thread is not None:
                self._queue.put(_STOP)
                self._thread = None
        if not drained:  # what the deadline left unsent is kept, not dropped (the worker may still post one)
            while True:
                try:
                    body = self._queue.get_nowait()
                except queue.Empty:
                    break
                if body is not _STOP:
                    self._keep(body)
                self._queue.task_done()
        return drained

    def _work(self) -> None:
        api = self.client()
        try:
            while True:
                body = self._queue.get()
                try:
                    if body is _STOP:
                        return
                    failure = post_score(api, body)
                    self._report(failure)
                    if failure is not None and failure.detail not in ("HTTP 400", "HTTP 422"):  # malformed: again too
                        self._keep(body)
                finally:
                    self._queue.task_done()
        finally:
            api.close()

    def _keep(self, body: Mapping[str, Any]) -> None:
        keep = self.keep_undelivered
        if keep is not None:
            try:
                keep(body)
            except Exception:  # noqa: BLE001 - an unwritable list costs the score, as it did before it existed
                pass

    def _report(self, failure: Failure | None) -> None:
        if failure is None:
            self.sent += 1
            self._warned.clear()
            return
        if failure.cause in self._warned:
            return
        self._warned.add(failure.cause)
        log.warning("langfuse_score_failed", backend="langfuse", cause=failure.cause, detail=failure.detail,
                    endpoint=safe_url(self.url),
                    hint="the run's spans are not affected; " + (
                        "scores Langfuse could not take are kept for `looptrace traces push` (a malformed one, "
                        "HTTP 400 or 422, is not); " if self.keep_undelivered is not None else "")
                    + "check LANGFUSE_BASE_URL and the keys")
