"""Runs rebuilt from stored or received spans (looptrace's and other producers'), judged by the same detector as a
live run: what `looptrace detect`, `watch`, `replay` and `report` read.

* ``RunRebuilder`` takes spans one at a time, in any order, and gives a ``Verdict`` per run as soon as it can be
  judged (``detect_spans`` drives it over an iterable); it reads ``tracefile.SpanRecord``s, and ``DETECTION_KEYS``
  (a ``KeySelection``) are the only attributes it reads, so a file reader can skip the rest.
* ``MODEL_OPERATIONS``: the ``gen_ai.operation.name`` values of a model call; ``model_call_usage``: what one model
  call's span says it used and cost, as the detector's cost ledger takes it.
* ``SESSION_PREFIX`` and ``CONVERSATION_PREFIX`` begin the keys of runs that have no trace of their own (model calls
  joined by session id, or by the history they continue).

The names load on first use: `looptrace detect` must not pay for what it does not read.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .conversations import CONVERSATION_PREFIX
    from .readers import SESSION_PREFIX, KeySelection
    from .run_rebuilder import DETECTION_KEYS, MODEL_OPERATIONS, RunRebuilder, Verdict
    from .span_usage import model_call_usage
    from .trace_detect import detect_spans

# public name -> the module of this package that defines it
_EXPORTS: dict[str, str] = {
    "CONVERSATION_PREFIX": "conversations",
    "DETECTION_KEYS": "run_rebuilder",
    "KeySelection": "readers",
    "MODEL_OPERATIONS": "run_rebuilder",
    "RunRebuilder": "run_rebuilder",
    "SESSION_PREFIX": "readers",
    "Verdict": "run_rebuilder",
    "detect_spans": "trace_detect",
    "model_call_usage": "span_usage",
}

__all__ = [
    "CONVERSATION_PREFIX",
    "DETECTION_KEYS",
    "MODEL_OPERATIONS",
    "SESSION_PREFIX",
    "KeySelection",
    "RunRebuilder",
    "Verdict",
    "detect_spans",
    "model_call_usage",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
