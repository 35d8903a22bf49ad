"""Langfuse at the edge: the attribute mapping, the scores, and reading traces back through its public API.

* ``api``: looptrace's one client for Langfuse's public API (``LangfuseAPI``, its errors ``LangfuseAPIError``), and
  ``TraceLinks``, links to traces in Langfuse's UI.
* ``scan``: `looptrace detect` over a Langfuse project: the traces a ``ScanQuery`` selects, rebuilt and judged, and
  resumable from a cursor (``CursorError``: one that cannot be resumed). Its function is ``scan_traces`` here
  (``scan.scan`` in its module: a package's attribute named like one of its modules is that module once imported,
  so the face cannot hand a function out under that name).
* ``scores``: anomalies as Langfuse scores (``LangfuseScores``, ``post_score``).
* ``mapping``: Langfuse's attributes for looptrace's spans, applied by its exporter (``resource_attributes``: the
  environment and release of a process's spans).

The names load on first use: none of this is imported until a command or a backend needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy_face import lazy_face

if TYPE_CHECKING:  # the same names, for type checkers
    from .api import LangfuseAPI, LangfuseAPIError, TraceLinks
    from .mapping import resource_attributes
    from .scan import CursorError, ScanQuery
    from .scan import scan as scan_traces
    from .scores import LangfuseScores, post_score

# public name -> the module of this package that defines it
_EXPORTS: dict[str, str] = {
    "LangfuseAPI": ".api",
    "LangfuseAPIError": ".api",
    "TraceLinks": ".api",
    "resource_attributes": ".mapping",
    "CursorError": ".scan",
    "ScanQuery": ".scan",
    "LangfuseScores": ".scores",
    "post_score": ".scores",
}
# public name -> (module, its name there), for a function named like the module that defines it: the import
# system binds a package's attribute of a submodule's name to the submodule once it is imported, so the face
# cannot hand the function out under that name
_RENAMED: dict[str, tuple[str, str]] = {
    "scan_traces": (".scan", "scan"),
}

__all__ = [
    "CursorError",
    "LangfuseAPI",
    "LangfuseAPIError",
    "LangfuseScores",
    "ScanQuery",
    "TraceLinks",
    "post_score",
    "resource_attributes",
    "scan_traces",
]


__getattr__, __dir__ = lazy_face(__name__, _EXPORTS, _RENAMED)
