"""7. The detector on real agents: precision and recall per anomaly type on recorded trajectories.

Replays every run of the trajectory corpus (``<repo>/../shared/trajectories``, or ``LOOPTRACE_TRAJECTORIES``) through
the same LoopDetector the live loop uses, fed the way the loop feeds it:

- a conversation is one session: one detector for the whole conversation, ``begin_run`` at every user text message
  (each user message starts a new run, as it does when an application calls ``Agent.run`` per user turn);
- every assistant message is a turn: its tool calls are observed with their results, then ``end_turn`` with the text
  the model wrote beside them (the user sees it, so it can report a failure as well as the final answer can); a
  result is an error when its source flagged it or when its command exited non-zero (``exit_code``), as a shell tool
  written for looptrace reports it;
- a text-only assistant message ends the run with stop reason ``end_turn`` and that text as the final answer; an agent
  that answers through a terminal tool (OpenHands ``finish``, ToolBench ``Finish``) ends its last run with the tool's
  answer, ``end_turn`` when the source says it finished normally; a conversation cut off mid-work (max steps) ends
  with no stop reason, so ignored_error cannot fire there.

A conversation counts as flagged for a type when any of its runs reported an anomaly of that type. The labels are
``benchmarks/trajectory_labels.jsonl`` (how they were made is in its first record): a record names a run and a type,
with ``"verdict": "false"`` for a flag read and found to be no such anomaly (without one, the run is a labelled
positive). Prints, per type: flags, true positives, precision, labelled positives, recall; then per file and type: the
flags, how many of them carry a label (all of them, or a random sample of ``SAMPLE`` where there are more: the same
sample every time), how many of those are true, and the precision; and the time the replay took.

    python -m benchmarks --only detector-eval          # in the benchmark table
    python -m benchmarks.detector_eval [--list]         # the table, and (--list) every flag and miss with its reason
    python -m benchmarks.detector_eval --judge claude-haiku-4-5   # with a real judge: needs ANTHROPIC_API_KEY

With ``--judge MODEL`` the replay asks that model (through the anthropic SDK, so ``ANTHROPIC_BASE_URL`` applies) the
questions the live loop would, within ``--judge-max-calls`` per run, and prints the table with the judge's calls,
tokens and cost beside it; without a key it says it skipped and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from looptrace.instrumentation.detector import (
    CYCLE,
    DEFAULT_JUDGE_MAX_CALLS,
    FAILING_TOOL,
    IGNORED_ERROR,
    REPEATED_CALL,
    REPEATED_TEXT,
    Anomaly,
    DetectorConfig,
    JudgeSummary,
    LoopDetector,
    ToolCall,
)

from .common import Row, say

CORPUS_ENV = "LOOPTRACE_TRAJECTORIES"
LABELS = Path(__file__).with_name("trajectory_labels.jsonl")
TYPES = (REPEATED_CALL, CYCLE, IGNORED_ERROR, FAILING_TOOL, REPEATED_TEXT)
TERMINAL_TOOLS = frozenset({"finish", "Finish"})
SAMPLE = 50  # flags labelled per file and type at most: a random sample, seeded by the file and type
PRECISION_BAR = 0.9  # per file and type, where a rule fires at least BAR_MIN_FLAGS times
BAR_MIN_FLAGS = 5
FINISHED_NORMALLY = frozenset({"finish_tool", "give_answer"})


def corpus_dir() -> Path:
    configured = os.environ.get(CORPUS_ENV)
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parent.parent.parent / "shared" / "trajectories"


def load_runs(directory: Path) -> Iterator[dict[str, Any]]:
    for path in sorted(directory.glob("*.jsonl")):
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                if line.strip():
                    run = json.loads(line)
                    run["source"] = path.stem  # the file it came from: the per-file figures are by file
                    yield run


def load_labels(path: Path = LABELS, scope: str | None = None) -> dict[str, set[str]]:
    """{anomaly type: run ids labelled positive}; with `scope`, only the labels of that scope ("run": the anomaly is
    in the run where the failure happened, the default; "later_run": a false claim in a later run of the
    conversation)."""
    positives: dict[str, set[str]] = defaultdict(set)
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            if "run" in record and record.get("verdict", "true") == "true" and scope in (None, record.get("scope", "run")):
                positives[record["type"]].add(record["run"])
    return positives


def load_verdicts(path: Path = LABELS) -> dict[tuple[str, str], bool]:
    """{(anomaly type, run id): whether it is one}, for every run a label record names: a record without a verdict
    is a positive (the first labels listed positives only), ``"verdict": "false"`` a flag read and found wrong."""
    verdicts: dict[tuple[str, str], bool] = {}
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            if "run" in record:
                key = (record["type"], record["run"])
                verdicts[key] = verdicts.get(key, False) or record.get("verdict", "true") == "true"
    return verdicts


def sampled(flags: list[str], where: str) -> list[str]:
    """The flags of one file and type that are labelled: all of them, or the same random `SAMPLE` of them."""
    ordered = sorted(flags)
    return ordered if len(ordered) <= SAMPLE else sorted(random.Random(where).sample(ordered, SAMPLE))


def replay(run: dict[str, Any], config: DetectorConfig | None = None,
           judged: list[JudgeSummary] | None = None, faults: list[str] | None = None) -> list[Anomaly]:
    """Every anomaly the detector reports for one conversation, run by run, one entry per streak. ``judged``, when
    given, receives what the judge did in each run; ``faults`` the detector's internal errors, if any."""
    detector = LoopDetector(config)
    results = {block["tool_use_id"]: block for message in run["messages"] if message["role"] == "user"
               for block in message["content"] if block.get("type") == "tool_result"}
    found: list[Anomaly] = []
    turn = 0
    in_run = False
    for message in run["messages"]:
        blocks = message["content"]
        if message["role"] == "user":
            if any(b.get("type") == "text" for b in blocks) and in_run:
                found += _end(detector, None, None, turn, judged)  # a user message mid-work: the run is cut off there
                in_run, turn = False, 0
            continue
        if not in_run:
            detector.begin_run()
            in_run = True
        turn += 1
        calls = [b for b in blocks if b.get("type") == "tool_use" and b.get("name") not in TERMINAL_TOOLS]
        for block in calls:
            result = results.get(block["id"], {})
            detector.observe(ToolCall(turn=turn, tool=block["name"], arguments=block.get("input"),
                                      call_id=block["id"], is_error=_failed(result), result=result.get("content")))
        if calls:
            said = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
            detector.end_turn(turn, said or None)
            continue
        terminal = [b for b in blocks if b.get("type") == "tool_use"]
        if terminal:  # the agent answered through its terminal tool
            reason = "end_turn" if run["meta"].get("end_reason") in FINISHED_NORMALLY else None
            found += _end(detector, reason, run.get("final_answer"), turn, judged)
        else:
            text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
            found += _end(detector, "end_turn", text, turn, judged)
        in_run, turn = False, 0
    if in_run:  # the conversation stopped mid-work: max steps, an error, a log that ends
        found += _end(detector, None, None, turn, judged)
    if faults is not None and detector.internal_errors:
        faults.append(f"{run['id']}: {detector.internal_errors} internal error(s), the last: "
                      f"{detector.last_internal_error}")
    return found


def _failed(result: dict[str, Any]) -> bool:
    """A result is an error when its source flagged it, or when it is a command's and the command exited non-zero: a
    shell tool of looptrace's reports that as an error (OpenHands' SDK does not flag it; swe-vorflux's export does)."""
    return bool(result.get("is_error")) or result.get("exit_code") not in (None, 0)


def _end(detector: LoopDetector, reason: str | None, text: str | None, turn: int,
         judged: list[JudgeSummary] | None = None) -> list[Anomaly]:
    detector.end_run(reason, text, turn)
    if judged is not None:
        judged.append(detector.judge_summary)
    return detector.anomalies


def evaluate(directory: Path, config: DetectorConfig | None = None,
             judged: list[JudgeSummary] | None = None) -> dict[str, Any]:
    positives = load_labels()
    verdicts = load_verdicts()
    flagged: dict[str, dict[str, list[Anomaly]]] = defaultdict(dict)
    by_file: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    runs_in: dict[str, int] = defaultdict(int)
    faults: list[str] = []
    started = time.perf_counter()
    runs = calls = 0
    for run in load_runs(directory):
        runs += 1
        runs_in[run["source"]] += 1
        calls += sum(1 for m in run["messages"] for b in m["content"] if b.get("type") == "tool_use")
        kinds = set()
        for anomaly in replay(run, config, judged, faults):
            flagged[anomaly.type].setdefault(run["id"], []).append(anomaly)
            kinds.add(anomaly.type)
        for kind in kinds:
            by_file[run["source"]][kind].append(run["id"])
    elapsed = time.perf_counter() - started
    table = {}
    for kind in TYPES:
        flags, labelled = set(flagged[kind]), positives.get(kind, set())
        table[kind] = {"flags": len(flags), "true": len(flags & labelled), "labelled": len(labelled),
                       "false_alarms": sorted(flags - labelled), "misses": sorted(labelled - flags)}
    for scope in ("run", "later_run"):  # ignored_error's recall, split by where the false claim was made
        labelled = load_labels(scope=scope).get(IGNORED_ERROR, set())
        caught = set(flagged[IGNORED_ERROR]) & labelled
        table[IGNORED_ERROR][f"recall_{scope}"] = (len(caught), len(labelled))
    return {"runs": runs, "calls": calls, "elapsed_s": elapsed, "table": table, "flagged": flagged,
            "per_file": _per_file(runs_in, by_file, verdicts), "faults": faults}


def _per_file(runs_in: dict[str, int], by_file: dict[str, dict[str, list[str]]],
              verdicts: dict[tuple[str, str], bool]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per file and type: flags, the labelled sample, its true flags, and the flags of the sample without a label."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for source in sorted(runs_in):
        table[source] = {}
        for kind in TYPES:
            flags = by_file[source][kind]
            sample = sampled(flags, f"{source}:{kind}")
            known = [run for run in sample if (kind, run) in verdicts]
            table[source][kind] = {"runs": runs_in[source], "flags": len(flags), "sample": len(sample),
                                   "labelled": len(known), "true": sum(verdicts[kind, run] for run in known),
                                   "wrong": [run for run in known if not verdicts[kind, run]],
                                   "unlabelled": [run for run in sample if (kind, run) not in verdicts]}
    return table


def meets_bar(line: dict[str, Any]) -> bool:
    """Whether a file's figures for one type meet the bar: every flag of the sample labelled, and, where the type fired
    `BAR_MIN_FLAGS` times or more, `PRECISION_BAR` of them true."""
    if line["unlabelled"]:
        return False
    return line["flags"] < BAR_MIN_FLAGS or line["true"] >= PRECISION_BAR * line["labelled"]


def _ratio(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "n/a"


def run(quick: bool = False) -> list[Row]:
    directory = corpus_dir()
    if not directory.is_dir():
        say(f"detector-eval skipped: no trajectory corpus at {directory} (set {CORPUS_ENV} to point at one)")
        return [Row("7 detector-eval", "skipped", "no corpus", context=str(directory))]
    result = evaluate(directory)
    rows = []
    for kind, line in result["table"].items():
        precision, recall = _ratio(line["true"], line["flags"]), _ratio(line["true"], line["labelled"])
        met = None if not line["flags"] and not line["labelled"] else (
            (not line["flags"] or line["true"] / line["flags"] >= 0.9)
            and (kind not in (REPEATED_CALL, IGNORED_ERROR) or not line["labelled"]
                 or line["true"] / line["labelled"] >= 0.8))
        rows.append(Row("7 detector-eval", f"{kind}: precision / recall", f"{precision} / {recall}",
                        "P>=90%, R>=80%", met,
                        f"{line['flags']} flags, {line['true']} true, {line['labelled']} labelled"))
    for scope, what in (("run", "claimed in the run that failed"),
                        ("later_run", "claimed in a later run (a judge's call; no judge offline)")):
        caught, labelled = result["table"][IGNORED_ERROR][f"recall_{scope}"]
        rows.append(Row("7 detector-eval", f"context: ignored_error recall, {what}", _ratio(caught, labelled),
                        context=f"{caught} of {labelled} labelled"))
    for source, kinds in result["per_file"].items():
        for kind, line in kinds.items():
            if line["flags"]:
                rows.append(Row("7 detector-eval", f"{source}: {kind} precision", _ratio(line["true"], line["labelled"]),
                                f">={PRECISION_BAR:.0%} at {BAR_MIN_FLAGS}+ flags", meets_bar(line),
                                f"{line['flags']} flags in {line['runs']} runs, {line['labelled']} labelled "
                                f"(of {line['sample']} sampled), {line['true']} true"))
    rows.append(Row("7 detector-eval", "replay time", f"{result['elapsed_s']:.2f} s",
                    context=f"{result['runs']} runs, {result['calls']} tool calls, "
                            f"{len(result['faults'])} runs with a detector fault"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.detector_eval", description=__doc__.split("\n")[0])
    parser.add_argument("--list", action="store_true", help="list every false alarm and miss")
    parser.add_argument("--judge-calls", action="store_true",
                        help="also count what a judge would be asked: replay with a judge that records each question "
                             "and gives no opinion, and say which labelled ignored errors reach it")
    parser.add_argument("--judge", metavar="MODEL",
                        help="replay with MODEL as the detector's judge, asked through the anthropic SDK (needs "
                             "ANTHROPIC_API_KEY; ANTHROPIC_BASE_URL applies), and print its calls and cost")
    parser.add_argument("--judge-max-calls", type=int, metavar="N", default=DEFAULT_JUDGE_MAX_CALLS,
                        help="judge calls per run at most, as LOOPTRACE_JUDGE_MAX_CALLS (default: %(default)s)")
    args = parser.parse_args(argv)
    directory = corpus_dir()
    if not directory.is_dir():
        print(f"skipped: no trajectory corpus at {directory} (set {CORPUS_ENV})")
        return 0
    if args.judge:
        return _judged_evaluation(directory, args.judge, max(args.judge_max_calls, 1), args.list)
    if args.judge_calls:
        _print_judge_calls(directory)
    result = evaluate(directory)
    _print_table(result, args.list)
    return 0


def _print_table(result: dict[str, Any], listing: bool) -> None:
    """The precision and recall table (and with ``listing`` every false alarm and miss)."""
    print(f"{result['runs']} runs, {result['calls']} tool calls, replayed in {result['elapsed_s']:.2f} s\n")
    print("| type | flags | true positives | precision | labelled positives | recall |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for kind, line in result["table"].items():
        print(f"| `{kind}` | {line['flags']} | {line['true']} | {_ratio(line['true'], line['flags'])} | "
              f"{line['labelled']} | {_ratio(line['true'], line['labelled'])} |")
    for scope in ("run", "later_run"):
        caught, labelled = result["table"][IGNORED_ERROR][f"recall_{scope}"]
        print(f"\nignored_error labelled with scope {scope!r}: {caught} of {labelled} caught", end="")
    print("\n")
    _print_per_file(result)
    for fault in result["faults"]:
        print(f"detector fault: {fault}")
    if listing:
        for kinds in result["per_file"].values():
            for kind, line in kinds.items():
                for label, runs in (("false alarm", line["wrong"]), ("unlabelled", line["unlabelled"])):
                    for run_id in runs:
                        first = result["flagged"][kind][run_id][0]
                        print(f"{label} {kind} {run_id} turn {first.turn}: {first.message[:300]}")
        for kind, line in result["table"].items():
            for run_id in line["misses"]:
                print(f"miss {kind} {run_id}")


def _print_per_file(result: dict[str, Any]) -> None:
    """Per file and type: how often it fired, and its precision on the labelled flags."""
    print(f"Per file: precision from the labels of the flags (all, or a random sample of {SAMPLE}); the bar is "
          f">= {PRECISION_BAR:.0%} wherever a type fired {BAR_MIN_FLAGS} times or more.\n")
    print("| file | runs | type | flags | labelled | true | precision | bar |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for source, kinds in result["per_file"].items():
        for kind, line in kinds.items():
            bar = "n/a" if not line["flags"] else ("met" if meets_bar(line) else "**not met**")
            unlabelled = f" ({len(line['unlabelled'])} unlabelled)" if line["unlabelled"] else ""
            print(f"| {source} | {line['runs']} | `{kind}` | {line['flags']} | {line['labelled']}{unlabelled} | "
                  f"{line['true']} | {_ratio(line['true'], line['labelled'])} | {bar} |")
    print()


def _judged_evaluation(directory: Path, model: str, max_calls: int, listing: bool) -> int:
    """The evaluation with a real judge: the table, then the judge's calls, tokens and cost. Skipped (exit 0) without
    a key: the offline table is the one without the judge."""
    if not (os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")):
        print(f"skipped: --judge {model} needs ANTHROPIC_API_KEY (the judge is a model call); the table without a "
              "judge is `python -m benchmarks.detector_eval`")
        return 0
    from looptrace.runtime.judge import ModelJudge
    from looptrace.runtime.models import AnthropicModel
    from looptrace.runtime.pricing import cost_usd, price_for
    from looptrace.runtime.result import Usage

    price = price_for(model)

    def cost(response: Any) -> float | None:
        return None if price is None else cost_usd(Usage.from_response(response), price,
                                                   cache_write_1h_tokens=Usage.one_hour_cache_writes(response))

    judge = ModelJudge(AnthropicModel(), model, cost_of=cost)
    judged: list[JudgeSummary] = []
    result = evaluate(directory, DetectorConfig(judge=judge, judge_max_calls=max_calls), judged)
    _print_table(result, listing)
    calls = sum(s.calls for s in judged)
    failures = sum(s.failures for s in judged)
    tokens = sum(s.input_tokens + s.output_tokens for s in judged)
    costs = [s.cost_usd for s in judged if s.calls]
    spent = "unknown (no price for the model)" if any(c is None for c in costs) else f"${sum(c or 0 for c in costs):.4f}"
    runs = sum(1 for s in judged if s.calls)
    print(f"\njudge {model}: {_counted(calls, 'call')} ({failures} failed) in {_counted(runs, 'run')}, "
          f"{_counted(tokens, 'token')}, cost {spent}; {_counted(sum(s.unjudged_over_cap for s in judged), 'question')}"
          f" left unjudged over the cap of {max_calls} per run")
    return 0


def _counted(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _print_judge_calls(directory: Path) -> None:
    asked: dict[str, int] = defaultdict(int)
    current = [""]

    def judge(request: Any) -> None:
        asked[current[0]] += 1
        return None  # no opinion: every verdict stays the rule's own

    for run in load_runs(directory):
        current[0] = run["id"]
        replay(run, DetectorConfig(judge=judge))
    print(f"with a judge: {sum(asked.values())} questions in {len(asked)} conversations")
    for run_id in sorted(load_labels().get(IGNORED_ERROR, set())):
        print(f"  labelled ignored_error {run_id}: {'put to the judge' if asked.get(run_id) else 'never reaches it'}")
    print()


if __name__ == "__main__":
    sys.exit(main())
