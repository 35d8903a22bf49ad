"""Session memory: one detector per conversation, so that what one run of it learnt serves the next.

What carries across the runs of a session (`LoopDetector.begin_run`): the calls that failed within the last
`repeat_window` turns (repeated_call counts them across user turns) and the tool errors a run left standing (the
judge is asked about a later run that answers "done" without calling a tool). Everything else (streaks, cycles, the
run's own errors, what the model said) ends at a run boundary: a user message came between.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .config import DetectorConfig
from .loop_detector import LoopDetector


class SessionDetectors:
    """Detector memory shared by the runs of one session (a conversation), bounded and evicted by age.

    ``detector_for(session_id)`` returns the session's detector, ready for a new run (`LoopDetector.begin_run`), so a
    call that keeps failing across the user turns of a conversation is caught. At most `max_sessions` are kept; a
    session idle for `ttl_s` seconds is forgotten, and the least recently used goes first when full. Runs of one
    session are expected one at a time (a conversation); concurrent runs of one session share a lock-protected
    lookup but then feed the same detector.
    """

    def __init__(self, config: DetectorConfig | None = None, *, max_sessions: int = 1000, ttl_s: float = 3600.0,
                 clock: Callable[[], float] | None = None) -> None:
        self.config = config
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self._clock = clock or time.monotonic
        self._lock = threading.Lock()
        self._sessions: dict[str, tuple[float, LoopDetector]] = {}

    def detector_for(self, session_id: str) -> LoopDetector:
        """The session's detector (a new one for a new session), with a new run begun."""
        now = self._clock()
        with self._lock:
            for stale in [k for k, (seen, _) in self._sessions.items() if now - seen > self.ttl_s]:
                del self._sessions[stale]
            entry = self._sessions.pop(session_id, None)
            detector = entry[1] if entry is not None else LoopDetector(self.config)
            self._sessions[session_id] = (now, detector)  # most recently used last
            while len(self._sessions) > self.max_sessions:
                del self._sessions[next(iter(self._sessions))]
        detector.begin_run()
        return detector

    def __len__(self) -> int:
        return len(self._sessions)
