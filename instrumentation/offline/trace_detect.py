"""The detector over spans instead of inside a loop: stored trace files, and a span processor for any agent.

``detect_spans`` judges the runs among stored spans (what `looptrace detect` does with a file); the runs are rebuilt
by ``run_rebuilder.RunRebuilder``, whose names are importable from here too. ``DetectorSpanProcessor`` runs the same
detection live, over any GenAI-instrumented agent in this process; it lives in ``trace_detect_live`` because it needs
the OpenTelemetry SDK, which `looptrace detect` must not pay for, and loads on first use.

Imports point one way: this module -> ``trace_detect_live`` -> ``run_rebuilder``, and this module -> ``run_rebuilder``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from ..detector import DetectorConfig
from ..tracefile.read import SpanRecord
from .run_rebuilder import DETECTION_KEYS, MODEL_OPERATIONS, RunRebuilder, Verdict

if TYPE_CHECKING:
    from .trace_detect_live import DetectorSpanProcessor

__all__ = ["DETECTION_KEYS", "MODEL_OPERATIONS", "DetectorSpanProcessor", "RunRebuilder", "Verdict", "detect_spans"]


def detect_spans(spans: Iterable[SpanRecord], config: DetectorConfig | None = None) -> Iterator[Verdict]:
    """A Verdict for every trace among the spans, as soon as each can be judged."""
    rebuilder = RunRebuilder(config)
    for span in spans:
        verdict = rebuilder.add(span)
        if verdict is not None:
            yield verdict
    yield from rebuilder.finish()


def __getattr__(name: str) -> object:
    # The processor needs the OpenTelemetry SDK, slow to import; `looptrace detect` uses the rest of this module only.
    if name == "DetectorSpanProcessor":
        from .trace_detect_live import DetectorSpanProcessor

        return DetectorSpanProcessor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
