"""What a looptrace run's root span recorded about how it ended, read back: the tool errors it left unresolved.

Apart from the replay reader (`recorded_run`), which rebuilds a whole run: ``looptrace traces show`` prints these
facts for every run it shows, and loads this and the record type only, not the detector's rules or the replay
machinery.
"""

from __future__ import annotations

from typing import Any

from ..detector.facts import UnresolvedToolError
from ..recording import semconv as sc
from ..tracefile.read import SpanRecord


def recorded_unresolved_errors(root: SpanRecord) -> tuple[int, list[UnresolvedToolError]] | None:
    """The tool errors a live run of looptrace's left unresolved, as its root span recorded them: their count and the
    most recent (its events); None for a root without the record (another producer's, or an older looptrace's)."""
    count = root.attributes.get(sc.RUN_UNRESOLVED_TOOL_ERRORS)
    if count is None:
        return None
    found = []
    for name, _, a in getattr(root, "events", ()) or ():
        if name == sc.UNRESOLVED_TOOL_ERROR_EVENT:
            found.append(UnresolvedToolError(
                tool=str(a.get(sc.GEN_AI_TOOL_NAME) or "?"), target=_optional_text(a.get(sc.UNRESOLVED_TARGET)),
                error=_optional_text(a.get(sc.UNRESOLVED_ERROR)), turn=as_count(a.get(sc.UNRESOLVED_TURN)),
                call_id=_optional_text(a.get(sc.GEN_AI_TOOL_CALL_ID)),
                failures=max(as_count(a.get(sc.UNRESOLVED_FAILURES)), 1),
                reported=_optional_text(a.get(sc.UNRESOLVED_REPORTED))))
    return max(as_count(count), len(found)), found


def as_count(value: Any) -> int:
    """A recorded count or turn number as an int, 0 when it is missing or not a number."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _optional_text(value: object) -> str | None:
    return None if value is None else str(value)
