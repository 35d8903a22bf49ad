"""13. `looptrace report` over a big trace file, against `looptrace detect` over the same file (issue 42).

The file: about 200 MB of a week of runs (benchmarks/week_of_runs.py: each scenario recorded once through the real
Agent, then replicated with fresh ids and times; every kind of loop, tool errors, approvals, long runs stopped by
their turn limit). Each command runs as its own process, start-up included, interleaved with the other:

* detect: `looptrace detect FILE` (the verdicts printed, as a CI gate runs it);
* report: `looptrace report --trace-file FILE --output PAGE` (the same verdicts, the overview, up to 100 runs drawn in
  full, the page written).

Goal: report / detect below 2.0 (the page costs less than a second read of the file). Peak memory of each is beside.
"""

from __future__ import annotations

import os
import tempfile

from .b9_trace_file import command, compile_bytecode, timed_process
from .common import Row, fmt_s, interleave, median, say
from .week_of_runs import record, write_week

GOAL = 2.0
MEGABYTES = 200


def run(quick: bool = False) -> list[Row]:
    reps = 1 if quick else 3
    megabytes = 50 if quick else MEGABYTES
    with tempfile.TemporaryDirectory(prefix="looptrace-bench13-") as tmp:
        say(f"  13: recording the scenarios and writing {megabytes} MB of runs")
        path = os.path.join(tmp, "week.jsonl")
        runs = write_week(path, record(tmp), megabytes=megabytes)
        page = os.path.join(tmp, "report.html")
        compile_bytecode()
        variants = {"detect": command("detect", path),
                    "report": command("report", "--trace-file", path, "--output", page)}
        rss: dict[str, int] = {}

        def sample(name: str):
            def one() -> float:
                elapsed, peak = timed_process(variants[name], tmp)
                rss[name] = max(rss.get(name, 0), peak)
                return elapsed
            return one

        say(f"  13: {reps} x (detect, report) over {os.path.getsize(path) / 1e6:.0f} MB")
        samples = interleave({name: sample(name) for name in variants}, reps=reps)
        detect, report = median(samples["detect"]), median(samples["report"])
        ratio = report / detect
        size = os.path.getsize(path) / 1e6
        memory = (f"; peak RSS report {rss['report'] / 1024:.0f} MB, detect {rss['detect'] / 1024:.0f} MB"
                  if rss.get("report") else "")
        return [Row("13 report", f"`looptrace report` / `looptrace detect`, {size:.0f} MB trace file, start-up "
                    f"included", f"{ratio:.2f}x", f"< {GOAL}x", ratio < GOAL,
                    f"{fmt_s(report)} vs {fmt_s(detect)} for {runs:,} runs; page {os.path.getsize(page) / 1e6:.1f} MB"
                    f"{memory}; {reps} interleaved samples")]
