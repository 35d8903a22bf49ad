"""python -m benchmarks [--quick] [--only N ...]: run the benchmarks and print one results table."""

from __future__ import annotations

import argparse
import datetime
import importlib
import logging
import sys
import time
import traceback

from .common import Row, machine, render_table, say

BENCHMARKS = {
    1: ("b1_telemetry_cost", "telemetry cost per turn vs raw OpenTelemetry"),
    2: ("b2_real_sdk", "through the real anthropic SDK vs a bare loop"),
    3: ("b3_detector", "detector: live cost, memory, `looptrace detect` vs json.loads"),
    4: ("b4_backend_trouble", "per-turn latency with the OTLP backend healthy, refusing, slow"),
    5: ("b5_many_agents", "200 concurrent arun calls vs one at a time, trace integrity"),
    6: ("b6_startup", "start-up CPU: import looptrace and looptrace --help vs import opentelemetry.sdk.trace"),
    7: ("detector_eval", "detector precision and recall on recorded trajectories (../shared/trajectories)"),
    8: ("b8_watch", "looptrace watch: spans/s, memory with 10,000 open runs, alert delay"),
    9: ("b9_trace_file", "trace file: default telemetry vs raw SDK spans; detect and show vs json.loads"),
    10: ("b10_peers", "side by side with the peers' anthropic instrumentations; goals 1-2 of issue 14"),
    12: ("b12_guards", "loop guards in LangChain, the OpenAI Agents SDK, Claude Agent SDK: cost per tool call"),
    13: ("b13_report", "`looptrace report` vs `looptrace detect` over a 200 MB trace file"),
    14: ("b14_trace_size", "trace file size: recorded runs replayed through Agent, file bytes over the GenAI content"),
    15: ("b15_mcp", "MCP overhead per run over stdio and streamable HTTP: per-run form vs held (`with agent:`)"),
}
NAMES = {"detector-eval": 7, "watch": 8, "trace-file": 9, "peers": 10, "guards": 12, "report": 13, "trace-size": 14,
         "mcp": 15}


def _benchmark_number(text: str) -> int:
    number = NAMES.get(text) or (int(text) if text.isdigit() else None)
    if number not in BENCHMARKS:
        raise argparse.ArgumentTypeError(
            f"unknown benchmark {text!r}; choose from 1-{max(BENCHMARKS)} or {', '.join(NAMES)}")
    return number


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions: a smoke run, not figures to quote")
    parser.add_argument("--only", type=_benchmark_number, nargs="+", metavar="N",
                        help=f"run only these benchmarks (1-{max(BENCHMARKS)}, or by name: {', '.join(NAMES)})")
    args = parser.parse_args(argv)
    # Exporters that cannot reach their backend (benchmark 4 does that on purpose) log every failure; the table is
    # what matters here.
    logging.disable(logging.CRITICAL)

    info = machine()
    rows: list[Row] = []
    failed = False
    started_all = time.perf_counter()
    for number in args.only or sorted(BENCHMARKS):
        module_name, title = BENCHMARKS[number]
        say(f"[{number}] {title}")
        started = time.perf_counter()
        try:
            module = importlib.import_module(f"{__package__}.{module_name}")
            rows.extend(module.run(quick=args.quick))
        except Exception:
            failed = True
            traceback.print_exc()
            rows.append(Row(f"{number} {module_name}", "FAILED", "see stderr", met=False))
        say(f"[{number}] done in {time.perf_counter() - started:.1f} s")

    print(f"looptrace benchmarks, {datetime.date.today().isoformat()}{' (--quick)' if args.quick else ''}: "
          f"{info['cpu']}, {info['cores']} cores, {info['memory']}, Python {info['python']}, {info['platform']}; "
          f"total {time.perf_counter() - started_all:.0f} s")
    print()
    print(render_table(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
