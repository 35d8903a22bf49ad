"""The labels a run carries (session, user, tags, metadata), checked once, whatever records the run.

Checked even when nothing records (``Agent(telemetry=False)``): a label a backend would drop should fail in a test,
not once telemetry is switched on. The rules are the strictest a backend applies: Langfuse's SDK drops a propagated
value over 200 characters (here it is cut to 200 and ends in "…", so the cut shows, never an exception in a run)
and takes metadata keys of letters, digits and underscores only (anything else raises ValueError at once, as does
an empty value).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_LABEL_CHARS = 200
_METADATA_KEY = re.compile(r"^[A-Za-z0-9_]+$")


@dataclass(frozen=True, slots=True)
class RunLabels:
    """A run's labels as they go on its spans: each value a non-empty string of at most ``MAX_LABEL_CHARS``; tags
    unique in their first order; metadata values as text (strings as they are, anything else as JSON, so 3 and "3"
    stay distinguishable)."""

    session_id: str | None = None
    user_id: str | None = None
    tags: tuple[str, ...] = ()
    metadata: tuple[tuple[str, str], ...] = ()


def run_labels(*, session_id: str | None = None, user_id: str | None = None, tags: Iterable[str] = (),
               metadata: Mapping[str, Any] | None = None) -> RunLabels:
    """The labels of one run, checked and capped (see the module's note)."""
    entries = []
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not _METADATA_KEY.match(key):
            raise ValueError(f"metadata key {key!r}: Langfuse accepts letters, digits and underscores only")
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        entries.append((key, checked(f"metadata[{key!r}]", text)))
    return RunLabels(
        session_id=None if session_id is None else checked("session_id", session_id),
        user_id=None if user_id is None else checked("user_id", user_id),
        tags=tuple(dict.fromkeys(checked("tag", tag) for tag in tags)),
        metadata=tuple(entries),
    )


def checked(what: str, value: object) -> str:
    """``value`` as a label: a non-empty string (else ValueError), capped."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return capped(value)


def capped(value: str) -> str:
    """At most MAX_LABEL_CHARS characters; a longer value is cut and ends in "…", so the cut shows."""
    return value if len(value) <= MAX_LABEL_CHARS else value[: MAX_LABEL_CHARS - 1] + "…"
