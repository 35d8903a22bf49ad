"""The detector as a span processor over any GenAI-instrumented agent in this process (see ``trace_detect``).

Apart from ``trace_detect`` because it needs the OpenTelemetry SDK, which `looptrace detect` has no use for. It builds
on ``run_rebuilder`` only, so that ``trace_detect`` can offer it without an import cycle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from ..detector import DetectorConfig
from ..logs import log
from ..tracefile.read import SpanRecord
from .run_rebuilder import RunRebuilder, Verdict


class DetectorSpanProcessor(SpanProcessor):
    """Runs the detector over any GenAI-instrumented agent in this process, as its spans end.

    Add it to the application's TracerProvider; ``on_verdict`` receives each trace's Verdict when its root span ends
    (use it to log, alert or fail a test). The spans themselves are not changed: they have already ended.
    """

    def __init__(self, on_verdict: Callable[[Verdict], None], config: DetectorConfig | None = None) -> None:
        self._rebuilder = RunRebuilder(config)
        self._on_verdict = on_verdict
        self._lock = threading.Lock()  # spans end on whatever thread ran them

    def on_start(self, span, parent_context=None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        context = span.get_span_context()
        if context is None:  # only a span the SDK never started has none
            return
        live = SpanRecord(
            trace_id=format(context.trace_id, "032x"),
            span_id=format(context.span_id, "016x"),
            parent_span_id=format(span.parent.span_id, "016x") if span.parent is not None else None,
            name=span.name,
            start_ns=span.start_time or 0,
            attributes=dict(span.attributes or {}),
            status_code=span.status.status_code.value,
        )
        with self._lock:
            verdict = self._rebuilder.add(live)
        if verdict is not None:
            self._deliver(verdict)

    def shutdown(self) -> None:
        with self._lock:
            verdicts = self._rebuilder.finish()
        for verdict in verdicts:
            self._deliver(verdict)

    def _deliver(self, verdict: Verdict) -> None:
        # Called from span.end() in someone else's code: a failing callback must not surface there.
        try:
            self._on_verdict(verdict)
        except Exception as exc:
            log.warning("verdict_callback_failed", trace_id=verdict.trace_id, error=f"{type(exc).__name__}: {exc}")

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True
