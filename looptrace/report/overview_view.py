"""The overview as the page shows it: its charts drawn, its tables as rows, each figure with the exact value beside
the formatted one (``data-value`` on the page), so that what a person reads can be checked against `detect --json`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from markupsafe import Markup

from looptrace.instrumentation.detector import format_usd

from .overview import Loop, Overview, Tally, ToolTally
from .runs import NOT_RECORDED, RunRecord
from .svg import Column, columns_svg

# One colour per way a run ends: green done, orange stopped by the detector, amber a limit, violet the model
# stopped, red an error, blue waiting for a person, grey the rest.
STATUS_COLORS = {
    "done": "#3a9d5d", "stopped_by_detector": "#e0731a", "loop_budget": "#c4521c", "max_turns": "#d9a400",
    "token_budget": "#d9a400", "cost_budget": "#c99700", "timeout": "#b88a00", "max_tokens": "#8a63c9",
    "stop_sequence": "#9b7bd4", "refusal": "#6f4bb0", "context_window": "#7d5cc0", "error": "#cc3333",
    "interrupted": "#7d8590", "awaiting_approval": "#3b7dd8", NOT_RECORDED: "#b8bec6",
}
SPARE_COLORS = ("#2aa198", "#d33682", "#6c71c4", "#859900", "#b58900", "#268bd2")
LOOP_COLOR = "#e0731a"
TABLE_ROWS = 25  # agents or tools listed at first; a button shows the others
SMALL_WIDTH = 360  # the three small charts side by side


@dataclass(frozen=True, slots=True)
class Row:
    """One agent or tool: its name and tally, and the width of its cost bar (0 to 100)."""

    name: str
    tally: Tally | ToolTally
    bar: float


def status_colors(statuses: list[str]) -> dict[str, str]:
    colors = {}
    spare = iter(SPARE_COLORS * (len(statuses) // len(SPARE_COLORS) + 1))
    for status in statuses:
        colors[status] = STATUS_COLORS.get(status) or next(spare)
    return colors


def overview_view(overview: Overview) -> dict[str, Any]:
    """What the overview part of the template reads."""
    unit, periods = overview.periods()
    statuses = [s for s, _ in overview.total.statuses.most_common()]
    colors = status_colors(statuses)
    return {
        "total": overview.total,
        "unit": unit,
        "statuses": [(s, colors[s], overview.total.statuses[s]) for s in statuses],
        "runs_chart": _runs_chart(periods, unit, statuses, colors),
        "share_chart": _share_chart(periods, unit),
        "usd_chart": _sum_chart(periods, unit, "usd"),
        "tokens_chart": _sum_chart(periods, unit, "tokens"),
        "agents": rows(overview.agents),
        "tools": rows(overview.tools),
        "top_loops": overview.top_loops(),
    }


def rows(table: dict[str, Any]) -> list[Row]:
    """Agents or tools, costliest loops first (then most looped, then most runs)."""
    ordered = sorted(table.items(), key=lambda item: (item[1].loop_usd, item[1].loop_tokens, item[1].looped,
                                                      item[1].runs, item[0]), reverse=True)
    top = max((t.loop_usd for _, t in ordered), default=0.0)
    top_tokens = max((t.loop_tokens for _, t in ordered), default=0)

    def bar(tally: Any) -> float:
        if top > 0:
            return 100 * tally.loop_usd / top
        return 100 * tally.loop_tokens / top_tokens if top_tokens else 0.0

    return [Row(name, tally, bar(tally)) for name, tally in ordered]


def period_label(moment: datetime, unit: str) -> str:
    return moment.strftime("%H:00") if unit == "hour" else moment.strftime("%b %d")


def period_key(moment: datetime, unit: str) -> str:
    return moment.strftime("%Y-%m-%dT%H") if unit == "hour" else moment.strftime("%Y-%m-%d")


def period_name(moment: datetime, unit: str) -> str:
    return moment.strftime("%a %d %b %Y, %H:00") if unit == "hour" else moment.strftime("%a %d %b %Y")


def _runs_chart(periods: list[tuple[datetime, Tally]], unit: str, statuses: list[str],
                colors: dict[str, str]) -> Markup:
    columns = []
    for moment, tally in periods:
        parts = [(s, float(tally.statuses[s])) for s in statuses]
        said = ", ".join(f"{tally.statuses[s]:,} {s}" for s in statuses if tally.statuses[s])
        columns.append(Column(period_label(moment, unit), parts,
                              f"{period_name(moment, unit)}: {tally.runs:,} runs" + (f" ({said})" if said else ""),
                              period_key(moment, unit)))
    return columns_svg(columns, colors, name="runs by status")


def _share_chart(periods: list[tuple[datetime, Tally]], unit: str) -> Markup:
    columns = [Column(period_label(m, unit), [("looped", 100 * t.share)],
                      f"{period_name(m, unit)}: {t.looped:,} of {t.runs:,} runs looped ({100 * t.share:.0f}%)",
                      period_key(m, unit)) for m, t in periods]
    return columns_svg(columns, {"looped": LOOP_COLOR}, height=200, width=SMALL_WIDTH,
                       value_format=lambda v: f"{v:.0f}%", name="share of runs that looped")


def _sum_chart(periods: list[tuple[datetime, Tally]], unit: str, what: str) -> Markup:
    columns = []
    for moment, t in periods:
        if what == "usd":
            value = t.loop_usd
            said = format_usd(value) + (f" (and {t.unpriced} looping runs without a price)" if t.unpriced else "")
        else:
            value, said = float(t.loop_tokens), f"{t.loop_tokens:,} tokens"
        columns.append(Column(period_label(moment, unit), [(what, value)],
                              f"{period_name(moment, unit)}: spent in loops {said}", period_key(moment, unit)))
    if what == "usd":
        return columns_svg(columns, {what: LOOP_COLOR}, height=200, width=SMALL_WIDTH, value_format=_axis_usd,
                           name="USD spent in loops")
    return columns_svg(columns, {what: LOOP_COLOR}, height=200, width=SMALL_WIDTH, value_format=_axis_tokens,
                       name="tokens spent in loops")


def _axis_usd(value: float) -> str:
    return f"${value:,.0f}" if value >= 10 else f"${value:.2f}" if value >= 0.1 or value == 0 else f"${value:.3f}"


def _axis_tokens(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:g}M"
    return f"{value / 1e3:g}k" if value >= 1e3 else f"{value:.0f}"


def loop_usd_text(loop: Loop) -> str:
    return format_usd(loop.usd) if loop.usd is not None else "unpriced"


def run_row(run: RunRecord) -> dict[str, Any]:
    """One line of the runs table."""
    cost = run.loop_cost
    return {"run": run, "anomalies": len(run.verdict.anomalies), "loop_usd": None if cost is None else cost.usd,
            "loop_tokens": None if cost is None else cost.total_tokens}
