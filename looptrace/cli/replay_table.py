"""`looptrace replay --all`: every run of a trace file, the findings its live run reported against the findings the
current detector (with the flags' settings) and policy make of it: a what-if for tuning thresholds on one's own runs.

A finding is a streak where it first fired (``replay.findings``): a higher ``--repeat-threshold`` moves one to a
later turn or removes it, a lower one adds some. Runs recorded with content are replayed through the loop (so the
policy's effect shows too: a run the live detector stopped may now go on, past what was recorded); runs without
content, and other agents' runs, are judged from their spans the way `looptrace detect` judges them.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from looptrace.cli.common import plural
from looptrace.cli.exit_codes import EXIT_OK
from looptrace.cli.replay_options import detector_changes, run_replay

if TYPE_CHECKING:
    from looptrace.instrumentation.detector import DetectorConfig
    from looptrace.replay import Finding
    from looptrace.runtime import Tool


@dataclass(slots=True)
class Row:
    """One run of the table: its findings then and now, and how it ended then and now."""

    trace_id: str
    agent: str
    how: str  # replay | spans (judged from the spans: no content, or not a looptrace run)
    recorded: list[Finding]
    now: list[Finding]
    recorded_status: str | None
    now_status: str | None
    past_recording_turn: int | None = None
    why: str = ""  # why the run was judged from its spans instead of replayed
    changes: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"trace_id": self.trace_id, "agent": self.agent, "how": self.how,
                "recorded": [f.to_dict() for f in self.recorded], "now": [f.to_dict() for f in self.now],
                "recorded_status": self.recorded_status, "now_status": self.now_status,
                "past_recording_turn": self.past_recording_turn, "changes": self.changes, "why": self.why}


def replay_all(path: Path, args: argparse.Namespace, *, tools: list[Tool] | None,
               detector: DetectorConfig | None, max_line_bytes: int) -> int:
    """Replay (or judge) every run of the file and print the table, or one JSON object per run."""
    rows = [row for spans in _traces(path, max_line_bytes).values()
            if (row := _row(spans, args, tools, detector)) is not None]
    for row in rows:
        row.changes = changes(row.recorded, row.now)
    if args.json:
        for row in rows:
            sys.stdout.write(json.dumps(row.to_dict(), ensure_ascii=False) + "\n")
    else:
        print_table(rows, detector_changes(args), sys.stdout)
    return EXIT_OK


def changes(recorded: list[Finding], now: list[Finding]) -> dict[str, int]:
    """Findings matched by type and tool: unchanged (same turn), moved (another turn), gone, new."""
    left = list(recorded)
    counted = {"unchanged": 0, "moved": 0, "gone": 0, "new": 0}
    for finding in now:
        same = next((r for r in left if (r.type, r.tool, r.turn) == (finding.type, finding.tool, finding.turn)), None)
        moved = same or next((r for r in left if (r.type, r.tool) == (finding.type, finding.tool)), None)
        if moved is None:
            counted["new"] += 1
            continue
        left.remove(moved)
        counted["unchanged" if same is not None else "moved"] += 1
    counted["gone"] = len(left)
    return counted


def print_table(rows: list[Row], settings: str, out: TextIO) -> None:
    recorded_width = max([len("recorded"), *(len(_listed(r.recorded)) for r in rows)])
    now_width = max([len("now"), *(len(_listed(r.now)) for r in rows)])
    out.write(f"{'trace':<12}  {'agent':<12}  {'recorded':<{recorded_width}}  {'now':<{now_width}}  ending\n")
    for row in rows:
        out.write(f"{row.trace_id[:12]:<12}  {row.agent[:12]:<12}  {_listed(row.recorded):<{recorded_width}}  "
                  f"{_listed(row.now):<{now_width}}  {_ending(row)}\n")
    totals = {key: sum(row.changes.get(key, 0) for row in rows) for key in ("unchanged", "moved", "gone", "new")}
    judged = sum(1 for row in rows if row.how == "spans")
    out.write(f"{plural(len(rows), 'run')}"
              + (f" ({judged} judged from {'its' if judged == 1 else 'their'} spans, not replayed)" if judged else "")
              + f", detector {settings}: {sum(len(r.recorded) for r in rows)} recorded, "
                f"{sum(len(r.now) for r in rows)} found now; {totals['unchanged']} unchanged, {totals['moved']} "
                f"moved, {totals['gone']} gone, {totals['new']} new\n")


def _listed(found: list[Finding]) -> str:
    return ", ".join(str(f) for f in found) or "-"


def _ending(row: Row) -> str:
    if row.how == "spans":
        return f"{row.recorded_status or '?'} (judged from its spans: {row.why})"
    if row.past_recording_turn is not None:  # the replay ended as an error there: it needed what was never recorded
        return f"{row.recorded_status or '?'} -> past the recording at turn {row.past_recording_turn}"
    return f"{row.recorded_status or '?'} -> {row.now_status or '?'}"


def _row(spans: list[Any], args: argparse.Namespace, tools: list[Tool] | None,
         detector: DetectorConfig | None) -> Row | None:
    from looptrace.instrumentation.offline import detect_spans
    from looptrace.instrumentation.recording import semconv as sc
    from looptrace.replay import (
        ContentNotRecorded,
        IncompleteRecording,
        NotReplayable,
        findings,
        rebuild_run,
        reported_anomalies,
    )

    try:
        recorded = rebuild_run(spans)
    except NotReplayable as exc:
        verdicts = list(detect_spans(spans, detector))
        if not verdicts:
            return None  # no agent in this trace at all
        verdict = verdicts[-1]
        root = next((s for s in spans if s.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OPERATION_INVOKE_AGENT),
                    None)
        agent = str(root.attributes.get(sc.GEN_AI_AGENT_NAME, "")) if root is not None else verdict.name
        why = ("recorded without content" if isinstance(exc, ContentNotRecorded)
               else f"span {exc.span_id} incomplete" if isinstance(exc, IncompleteRecording)
               else "not a looptrace run")
        return Row(trace_id=verdict.trace_id, agent=agent or verdict.name, how="spans",
                   recorded=findings(reported_anomalies(spans)), now=findings(verdict.anomalies),
                   recorded_status=verdict.status, now_status=None, why=why)
    replayed = run_replay(recorded, args, tools=tools, detector=detector)
    return Row(trace_id=recorded.trace_id, agent=recorded.agent, how="replay", recorded=findings(recorded.anomalies),
               now=findings(replayed.anomalies), recorded_status=recorded.status,
               now_status=replayed.result.status.value, past_recording_turn=replayed.past_recording_turn)


def _traces(path: Path, max_line_bytes: int) -> dict[str, list[Any]]:
    """Every span of the file by trace, each line decoded once."""
    from looptrace.cli.trace_reading import LineReporter, spans_of
    from looptrace.replay import runs_in

    with LineReporter(path, max_line_bytes) as report:
        by_trace = runs_in(spans_of(path, report, None))
        report.finish(spans_required=True)
    return by_trace
