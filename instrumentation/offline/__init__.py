"""Runs rebuilt from stored or received spans (looptrace's and other producers'), judged by the same detector as a
live run: what `looptrace detect`, `watch`, `replay` and `report` read.

* ``RunRebuilder`` takes spans one at a time, in any order, and gives a ``Verdict`` per run as soon as it can be
  judged (``detect_spans`` drives it over an iterable, ``DetectorSpanProcessor`` over an application's live spans);
  it reads ``tracefile.SpanRecord``s, and ``DETECTION_KEYS`` (a ``KeySelection``) are the only attributes it reads,
  so a file reader can skip the rest.
* ``MODEL_OPERATIONS``: the ``gen_ai.operation.name`` values of a model call; ``model_call_usage``: what one model
  call's span says it used and cost, as the detector's cost ledger takes it.
* ``SESSION_PREFIX`` and ``CONVERSATION_PREFIX`` begin the keys of runs that have no trace of their own (model calls
  joined by session id, or by the history they continue).
* ``rebuild_run``: a stored looptrace run as ``replay`` needs it (``RecordedRun``: every response and tool result;
  ``runs_in``: the runs of some spans; ``reported_anomalies``: what the live run reported), or why it cannot be
  replayed (``NotReplayable``: ``ContentNotRecorded``, ``IncompleteRecording``).
* ``recorded_unresolved_errors``: the tool errors a stored run's root span says it left unresolved.

The names load on first use: `looptrace detect` must not pay for what it does not read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy_face import lazy_face

if TYPE_CHECKING:
    from .conversations import CONVERSATION_PREFIX
    from .readers import SESSION_PREFIX, KeySelection
    from .recorded_facts import recorded_unresolved_errors
    from .recorded_run import (
        ContentNotRecorded,
        IncompleteRecording,
        NotReplayable,
        RecordedAnomaly,
        RecordedCall,
        RecordedModelError,
        RecordedRun,
        rebuild_run,
        reported_anomalies,
        runs_in,
    )
    from .run_rebuilder import DETECTION_KEYS, MODEL_OPERATIONS, RunRebuilder, Verdict
    from .span_usage import model_call_usage
    from .trace_detect import DetectorSpanProcessor, detect_spans

# public name -> the module of this package that defines it
_EXPORTS: dict[str, str] = {
    "CONVERSATION_PREFIX": ".conversations",
    "DETECTION_KEYS": ".run_rebuilder",
    "KeySelection": ".readers",
    "MODEL_OPERATIONS": ".run_rebuilder",
    "RunRebuilder": ".run_rebuilder",
    "SESSION_PREFIX": ".readers",
    "Verdict": ".run_rebuilder",
    "detect_spans": ".trace_detect",
    "model_call_usage": ".span_usage",
    "recorded_unresolved_errors": ".recorded_facts",
    "ContentNotRecorded": ".recorded_run",
    "IncompleteRecording": ".recorded_run",
    "NotReplayable": ".recorded_run",
    "RecordedAnomaly": ".recorded_run",
    "RecordedCall": ".recorded_run",
    "RecordedModelError": ".recorded_run",
    "RecordedRun": ".recorded_run",
    "rebuild_run": ".recorded_run",
    "reported_anomalies": ".recorded_run",
    "runs_in": ".recorded_run",
    "DetectorSpanProcessor": ".trace_detect",
}

__all__ = [
    "CONVERSATION_PREFIX",
    "DETECTION_KEYS",
    "MODEL_OPERATIONS",
    "SESSION_PREFIX",
    "ContentNotRecorded",
    "DetectorSpanProcessor",
    "IncompleteRecording",
    "KeySelection",
    "NotReplayable",
    "RecordedAnomaly",
    "RecordedCall",
    "RecordedModelError",
    "RecordedRun",
    "RunRebuilder",
    "Verdict",
    "detect_spans",
    "model_call_usage",
    "rebuild_run",
    "recorded_unresolved_errors",
    "reported_anomalies",
    "runs_in",
]


__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
