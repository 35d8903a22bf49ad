"""Where spans and metrics go: configure(), the SDK's exporters built from Settings, the guard that keeps a backend's
trouble away from the agent, and ``push`` for what a backend could not take.

* ``setup``: ``configure()`` and the ``Telemetry`` it returns; ``context_from_traceparent`` (a parent from W3C
  trace context, for `looptrace run` started by a traced process); ``own_telemetry`` (an Agent's own pipeline).
* ``mapped``: each backend's attribute mapping (Langfuse's, OpenInference's), applied as its spans leave
  (``MappedSpanProcessor``, ``mappings_for``).
* ``push``: the spans and scores a backend could not take, sent from the trace file, never twice. Its function is
  ``push_undelivered`` here (``push.push`` in its module: a package's attribute named like one of its modules is
  that module once imported, so the face cannot hand a function out under that name).

The names load on first use: importing this package imports none of the SDK's exporters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy_face import lazy_face

if TYPE_CHECKING:  # the same names, for type checkers
    from .mapped import MappedSpanProcessor, mappings_for
    from .push import PushReport
    from .push import push as push_undelivered
    from .setup import Telemetry, configure, context_from_traceparent, own_telemetry

# public name -> the module of this package that defines it
_EXPORTS: dict[str, str] = {
    "MappedSpanProcessor": ".mapped",
    "mappings_for": ".mapped",
    "PushReport": ".push",
    "Telemetry": ".setup",
    "configure": ".setup",
    "context_from_traceparent": ".setup",
    "own_telemetry": ".setup",
}
# public name -> (module, its name there), for a function named like the module that defines it: the import
# system binds a package's attribute of a submodule's name to the submodule once it is imported, so the face
# cannot hand the function out under that name
_RENAMED: dict[str, tuple[str, str]] = {
    "push_undelivered": (".push", "push"),
}

__all__ = [
    "MappedSpanProcessor",
    "PushReport",
    "Telemetry",
    "configure",
    "context_from_traceparent",
    "mappings_for",
    "own_telemetry",
    "push_undelivered",
]


__getattr__, __dir__ = lazy_face(__name__, _EXPORTS, _RENAMED)
