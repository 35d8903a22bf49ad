"""`looptrace report`: one self-contained HTML page of what the agents did, where they looped and what it cost.

Spans go in (``RunCollector.add``, each as `looptrace detect` reads it: ``tracefile.SpanRecord`` with the attributes of
``READ_KEYS``), a ``Report`` comes out (``RunCollector.finish``), and ``render`` makes it a page that fetches nothing
when opened (``write_page`` writes it whole). The verdicts are `detect`'s: the same run rebuilder over the same spans.

* ``collector``: spans to judged runs, their facts, the overview's sums, the bound on drawn runs (``selection``).
* ``overview`` / ``overview_view``: the sums per hour or day, agent and tool; the costliest loops; the charts.
* ``timeline`` / ``timeline_svg`` / ``run_view``: one run's turns, loops and content, and its timeline.
* ``page``: the template filled, style and script inlined; ``svg``: the chart shapes; ``content``: message JSON as
  text.
"""

from __future__ import annotations

from .collector import Report, RunCollector
from .facts import REPORT_KEYS, read_keys
from .page import render, write_page
from .selection import DEFAULT_MAX_RUNS

__all__ = ["DEFAULT_MAX_RUNS", "REPORT_KEYS", "Report", "RunCollector", "read_keys", "render", "write_page"]
