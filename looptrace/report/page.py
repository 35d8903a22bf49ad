"""The report as one HTML file: Jinja2 fills the template (autoescaped: every recorded text is data, never markup),
the style sheet and the small script are inlined, the charts are inline SVG. The page fetches nothing when opened.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import time
from datetime import datetime
from importlib import resources
from pathlib import Path

from jinja2 import Environment, StrictUndefined

from looptrace import __version__
from looptrace.instrumentation.detector import format_usd

from .collector import Report
from .overview_view import TABLE_ROWS, loop_usd_text, overview_view, run_row
from .run_view import run_view, verdict_lines
from .svg import duration_text

_FILES = resources.files(__package__)


def render(report: Report, *, source: str, generated_ns: int | None = None, notes: list[str] | None = None) -> str:
    """The page's HTML. ``source`` names what was read (the trace file); ``notes`` are said at the top."""
    environment = _environment()
    template = environment.from_string(_text("templates/report.html.j2"))
    script = _text("static/report.js")
    return template.render(
        report=report, source=source, version=__version__,
        generated=_when(generated_ns or time.time_ns(), seconds=True),
        since=None if report.since_ns is None else _when(report.since_ns),
        notes=[*report.notes, *(notes or [])],
        overview=overview_view(report.overview),
        runs=[run_row(run) for run in report.runs],
        views=[run_view(run) for run in report.runs],
        verdict_lines=verdict_lines, table_rows=TABLE_ROWS,
        style=_text("static/report.css"), script=script, csp=content_policy(script),
        zone=time.strftime("%Z") or time.strftime("%z"),
    )


def content_policy(script: str) -> str:
    """The page's Content-Security-Policy: nothing may be fetched (no script, style sheet, image, font or connection
    from anywhere), and the one script that runs is the page's own, named by its hash. A recorded text that somehow
    became markup could still not load or run anything."""
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    return (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; base-uri 'none'; "
            f"form-action 'none'")


def write_page(html: str, path: str | os.PathLike[str]) -> Path:
    """Write the page whole or not at all: a reader never opens half a page, and a failed write leaves any older
    report where it was."""
    target = Path(path)
    # (not mkstemp: its file is private to its owner, and a report is made to be read by others, as umask says)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(temporary, "x", encoding="utf-8") as out:
            out.write(html)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return target


def _environment() -> Environment:
    environment = Environment(autoescape=True, undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    environment.filters.update(usd=_usd, num=_count, percent=_percent, when=_when, duration=duration_text,
                               loop_usd=loop_usd_text)
    return environment


def _text(name: str) -> str:
    return _FILES.joinpath(name).read_text(encoding="utf-8")


def _usd(value: float | None, unpriced: str = "unpriced") -> str:
    return unpriced if value is None else format_usd(value)


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _percent(share: float) -> str:
    return f"{100 * share:.0f}%" if share == 0 or share >= 0.01 else "<1%"


def _when(ns: int, seconds: bool = False) -> str:
    if not ns:
        return "?"
    return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")

