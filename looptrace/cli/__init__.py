"""The ``looptrace`` command line: the composition root that wires the loop (``looptrace.runtime``) to its telemetry
(``looptrace.instrumentation``). ``main`` is what the ``looptrace`` script and ``python -m looptrace`` run."""

from looptrace.cli.entry import main

__all__ = ["main"]
