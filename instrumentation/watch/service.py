"""`serve`: a `WatchServer` run as a long-lived service, until SIGTERM or SIGINT stops it cleanly.

Logging is the caller's: the CLI sets up service logging (``logs.configure_service_logging``) before it serves.
"""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING

from ..alerts import Alerts
from .server import WatchServer
from .settings import WatchSettings

if TYPE_CHECKING:
    from ..langfuse.scores import LangfuseScores


def serve(settings: WatchSettings, *, scores: LangfuseScores | None = None, alerts: Alerts | None = None) -> int:
    """Listen until SIGTERM or SIGINT, then stop cleanly (every open run judged, last alerts sent). Returns 0.

    Raises `intake.ListenError` before serving anything when a port cannot be had. ``scores`` belong to the server
    from here on: closed when it stops, or at once if it cannot start.
    """
    import prometheus_client

    prometheus_client.disable_created_metrics()  # a _created series beside every counter only doubles the scrape
    try:
        server = WatchServer(settings, alerts=alerts, scores=scores)
    except BaseException:
        if scores is not None:
            scores.close(0.0)
        raise
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    server.start()
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
