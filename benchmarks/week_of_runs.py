"""A week of agent runs in a trace file, made by the real Agent: the input of `looptrace report`'s benchmark and of the
README's screenshots.

Each scenario is one run of a real ``Agent`` with real tools and a scripted model (``ScriptedModel``, each response
given after a pause, as a model takes time), recorded once through ``TraceFileProcessor`` into a file of its own.
``write_week`` then replicates the recorded runs into one trace file: each copy with fresh trace and span ids, moved
in time to a moment of the week before now (working hours more often than nights), the scenarios mixed by weight:
most runs end well, some loop in each of the detector's ways, some wait for a person's approval.

    python -m benchmarks.week_of_runs OUT.jsonl [--runs N | --megabytes M]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from looptrace import Agent, Limits, ScriptedModel, approve, reject, tool
from looptrace.cli.demo import DEMO_MODEL, DEMO_SYSTEM, Inventory, equipment_script, runaway_script
from looptrace.instrumentation.tracefile import TraceFileProcessor

from . import scenario

DAY_NS = 86_400 * 10**9


def _answer(text: str, tokens: tuple[int, int] = (900, 60)) -> dict[str, Any]:
    return {"stop_reason": "end_turn", "content": [{"type": "text", "text": text}],
            "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1]}}


def _call(name: str, arguments: dict[str, Any], call_id: str, tokens: tuple[int, int], text: str = "") -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content.append({"type": "tool_use", "id": call_id, "name": name, "input": arguments})
    return {"stop_reason": "tool_use", "content": content,
            "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1]}}


def _paced(responses: list[dict[str, Any]], seconds: float) -> list[Callable[[dict[str, Any]], dict[str, Any]]]:
    """The responses, each given after a pause of about ``seconds`` (a model takes time to answer)."""
    pace = random.Random(len(responses))

    def later(response: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
        def give(_: dict[str, Any]) -> dict[str, Any]:
            time.sleep(seconds * pace.uniform(0.6, 1.6))
            return response
        return give

    return [later(r) for r in responses]


def _slow(seconds: float) -> None:
    time.sleep(seconds)


# --- the agents' tools ----------------------------------------------------------------------------------------------

@tool
def search_docs(query: str) -> list[dict[str, str]]:
    """Search the help centre.

    Args:
        query: Words to look for.
    """
    _slow(0.03)
    return [{"article_id": "KB-7", "title": "Refunds for annual plans"}, {"article_id": "KB-9", "title": "Invoices"}]


@tool
def get_article(article_id: str) -> str:
    """Read one help-centre article.

    Args:
        article_id: An id from search_docs.
    """
    _slow(0.02)
    return "Annual plans are refunded pro rata within 30 days; see the billing page for the form."


@tool
def create_ticket(title: str, body: str) -> dict[str, str]:
    """Open a support ticket.

    Args:
        title: One line.
        body: What the customer needs.
    """
    _slow(0.05)
    return {"ticket": "T-1042", "title": title}


@tool
def run_tests(path: str) -> str:
    """Run the test suite at a path.

    Args:
        path: A test file or folder.
    """
    _slow(0.12)
    raise RuntimeError(f"ImportError while collecting {path}: no module named 'billing.v2'")


@tool
def read_file(path: str) -> str:
    """Read a file of the repository.

    Args:
        path: The file's path.
    """
    _slow(0.01)
    return "from billing.v2 import Invoice\n\n\ndef test_total():\n    assert Invoice(3).total == 3\n"


@tool(needs_approval=lambda arguments: arguments["amount"] > 100)
def pay(to: str, amount: int) -> str:
    """Send money.

    Args:
        to: Who is paid.
        amount: Euros.
    """
    _slow(0.04)
    return f"paid {amount} euros to {to}"


# --- the scenarios --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scenario:
    name: str
    weight: int  # how often it runs, relative to the others
    run: Callable[[TracerProvider], Any]


def _booking(script: list[dict[str, Any]], task: str) -> Callable[[TracerProvider], Any]:
    def run(provider: TracerProvider) -> Any:
        agent = Agent(DEMO_MODEL, tools=Inventory().tools(), system=DEMO_SYSTEM, name="booking",
                      client=ScriptedModel(_paced(script, 0.25)), tracer_provider=provider)
        return agent.run(task)
    return run


def _claims_success() -> list[dict[str, Any]]:
    """A reservation fails twice, the model looks elsewhere, then says it reserved the equipment all the same."""
    return [_call("reserve_equipment", {"item_id": "EQ-001", "date": "2026-10-08"}, "toolu_01", (420, 48)),
            _call("reserve_equipment", {"item_id": "EQ-001", "date": "2026-10-08"}, "toolu_02", (480, 48)),
            _call("search_equipment", {"keyword": "projector"}, "toolu_03", (540, 30)),
            _answer("Done: I have reserved the equipment for October 8, full day.", (610, 22))]


def _support(cycle: bool) -> Callable[[TracerProvider], Any]:
    rounds = 4 if cycle else 1
    script = []
    for n in range(rounds):
        script.append(_call("search_docs", {"query": "refund annual plan"}, f"toolu_s{n}", (700 + 90 * n, 40),
                            "Let me check the help centre."))
        script.append(_call("get_article", {"article_id": "KB-7"}, f"toolu_g{n}", (760 + 90 * n, 35)))
    script.append(_call("create_ticket", {"title": "Refund request", "body": "Annual plan, day 12"}, "toolu_t",
                        (980, 60)))
    script.append(_answer("Annual plans are refunded pro rata within 30 days: I opened ticket T-1042 for you."))

    def run(provider: TracerProvider) -> Any:
        agent = Agent("claude-haiku-4-5", tools=[search_docs, get_article, create_ticket], name="support",
                      system="You answer customers from the help centre.",
                      client=ScriptedModel(_paced(script, 0.35)), tracer_provider=provider)
        return agent.run("A customer asks for a refund of their annual plan.")
    return run


def _coder() -> Callable[[TracerProvider], Any]:
    paths = ["tests/", "tests/test_billing.py", "tests/billing", "tests/test_billing.py::test_total", "tests/unit",
             "tests/integration"]
    script = [_call("read_file", {"path": "tests/test_billing.py"}, "toolu_r", (1800, 80), "I will run the tests.")]
    script += [_call("run_tests", {"path": p}, f"toolu_{n}", (2100 + 400 * n, 60)) for n, p in enumerate(paths)]
    script.append(_answer("The tests cannot be collected: billing.v2 does not exist. Shall I add it?"))

    def run(provider: TracerProvider) -> Any:
        agent = Agent("claude-opus-4-5", tools=[read_file, run_tests], name="coder",
                      system="You fix failing tests.", limits=Limits(max_turns=12),
                      client=ScriptedModel(_paced(script, 0.6)), tracer_provider=provider)
        return agent.run("Make the billing tests pass.")
    return run


def _research() -> Callable[[TracerProvider], Any]:
    """A long run that makes progress every turn until its turn limit stops it."""
    script = [{**scenario.tool_use(step, "research"), "usage": {"input_tokens": 900 + 250 * step, "output_tokens": 60}}
              for step in range(1, 16)]

    def run(provider: TracerProvider) -> Any:
        agent = Agent(scenario.MODEL, tools=[scenario.lookup], system=scenario.SYSTEM, name="research",
                      limits=Limits(max_turns=12), client=ScriptedModel(_paced(script, 0.3)),
                      tracer_provider=provider)
        return agent.run("Compare the widgets of the three suppliers.")
    return run


def _payments(amount: int, approved: bool | None) -> Callable[[TracerProvider], Any]:
    script = [_call("pay", {"to": "Ann", "amount": amount}, "toolu_p", (500, 40)),
              _answer(f"I paid Ann {amount} euros." if approved else "I did not pay Ann: the payment was refused.")]

    def decide(request: Any) -> Any:
        time.sleep(0.4)  # a person reads the request
        return approve() if approved else reject("Ann was paid on Monday")

    def run(provider: TracerProvider) -> Any:  # (no approver: the run pauses, awaiting a person's decision)
        agent = Agent("claude-sonnet-4-5", tools=[pay], name="payments", approver=None if approved is None else decide,
                      client=ScriptedModel(_paced(script, 0.2)), tracer_provider=provider)
        return agent.run(f"Pay Ann {amount} euros")
    return run


SCENARIOS = (
    Scenario("booking", 30, _booking(equipment_script(), "Reserve a projector for 2026-10-08.")),
    Scenario("booking-runaway", 5, _booking(runaway_script(), "Find me a projector.")),
    Scenario("booking-claims-success", 3, _booking(_claims_success(), "Reserve Projector A for 2026-10-08.")),
    Scenario("support", 25, _support(cycle=False)),
    Scenario("support-cycle", 4, _support(cycle=True)),
    Scenario("coder", 6, _coder()),
    Scenario("payments-small", 10, _payments(40, approved=True)),
    Scenario("payments-approved", 4, _payments(500, approved=True)),
    Scenario("payments-rejected", 3, _payments(900, approved=False)),
    Scenario("payments-waiting", 2, _payments(2000, approved=None)),
    Scenario("research", 5, _research()),
)


def record(folder: str) -> dict[str, list[bytes]]:
    """Each scenario run once through the real Agent into a trace file of its own: its lines, by scenario."""
    logging.getLogger("looptrace").disabled = True  # the anomalies' log lines: the file is what is wanted here
    recorded = {}
    for each in SCENARIOS:
        path = os.path.join(folder, f"{each.name}.jsonl")
        provider = TracerProvider()
        provider.add_span_processor(TraceFileProcessor(path))
        each.run(provider)
        provider.shutdown()
        with open(path, "rb") as handle:
            recorded[each.name] = handle.read().splitlines(keepends=True)
    return recorded


_IDS = re.compile(rb'"(traceId|spanId|parentSpanId)":"([0-9a-fA-F]+)"')
_TIMES = re.compile(rb'"(startTimeUnixNano|endTimeUnixNano|timeUnixNano)":"(\d+)"')
_FIRST_START = re.compile(rb'"startTimeUnixNano":"(\d+)"')


def copy_run(lines: list[bytes], start_ns: int, rng: random.Random) -> list[bytes]:
    """The run's lines with fresh ids (one new trace id, a new id per span) and moved to start at ``start_ns``."""
    first = min(int(m.group(1)) for line in lines for m in _FIRST_START.finditer(line))
    shift = start_ns - first
    trace_id = f"{rng.getrandbits(128):032x}".encode()
    span_ids: dict[bytes, bytes] = {}

    def new_id(match: re.Match[bytes]) -> bytes:
        key, value = match.group(1), match.group(2)
        if key == b"traceId":
            return b'"traceId":"' + trace_id + b'"'
        if not value:
            return match.group(0)
        fresh = span_ids.setdefault(value, f"{rng.getrandbits(64):016x}".encode())
        return b'"' + key + b'":"' + fresh + b'"'

    def moved(match: re.Match[bytes]) -> bytes:
        return b'"' + match.group(1) + b'":"' + str(int(match.group(2)) + shift).encode() + b'"'

    return [_TIMES.sub(moved, _IDS.sub(new_id, line)) for line in lines]


def moment_of_week(rng: random.Random, now_ns: int, days: int) -> int:
    """A start time within the ``days`` before now: mostly working hours, some evenings, few nights."""
    day = rng.randrange(days)
    hour = rng.choices(range(24), weights=[1, 1, 1, 1, 1, 1, 2, 4, 8, 10, 10, 9, 7, 9, 10, 10, 9, 7, 5, 4, 3, 2, 1, 1])[0]
    midnight = now_ns - (day + 1) * DAY_NS
    midnight -= midnight % DAY_NS
    return midnight + hour * 3_600 * 10**9 + rng.randrange(3_600 * 10**9)


def write_week(path: str, recorded: dict[str, list[bytes]], *, runs: int | None = None,
               megabytes: float | None = None, days: int = 7, seed: int = 7) -> int:
    """Replicate the recorded runs into ``path`` until it holds ``runs`` runs or ``megabytes``; returns the runs."""
    rng = random.Random(seed)
    names = [s.name for s in SCENARIOS]
    weights = [s.weight for s in SCENARIOS]
    now_ns = time.time_ns()
    written = size = 0
    with open(path, "wb") as out:
        while (runs is not None and written < runs) or (megabytes is not None and size < megabytes * 1e6):
            name = rng.choices(names, weights)[0]
            for line in copy_run(recorded[name], moment_of_week(rng, now_ns, days), rng):
                out.write(line)
                size += len(line)
            written += 1
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.week_of_runs", description=__doc__)
    parser.add_argument("output")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--runs", type=int, default=None)
    size.add_argument("--megabytes", type=float, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="looptrace-week-") as folder:
        recorded = record(folder)
        runs = args.runs if args.runs is not None or args.megabytes is not None else 120
        written = write_week(args.output, recorded, runs=runs, megabytes=args.megabytes)
    print(f"{written:,} runs written to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
