"""The run every benchmark replays: a model that calls a no-op tool once per turn, then ends its turn.

The arguments change every turn so the detector sees progress (no repeated_call, no cycle) and the run always goes
the full distance; only the thing a benchmark varies differs between its variants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from looptrace.runtime import Limits, tool

MODEL = "claude-sonnet-4-5"
SYSTEM = "You look things up, one step at a time."
LIMITS = Limits(max_turns=1000)  # the runs go their full length; the default 10 would cut them short


@tool
def lookup(item: str, step: int) -> str:
    """Look an item up (a no-op: returns at once).

    Args:
        item: What to look up.
        step: Which step of the task this is.
    """
    return "ok"


async def _alookup(item: str, step: int) -> str:
    """Look an item up (a no-op: returns at once).

    Args:
        item: What to look up.
        step: Which step of the task this is.
    """
    return "ok"


# The same tool as a coroutine, for arun without a thread per call.
alookup = tool(_alookup, name="lookup")


def lookup_plain(item: str, step: int) -> str:
    """The bare loop's version: a plain function."""
    return "ok"


def tool_use(step: int, run: str = "run-0") -> dict[str, Any]:
    return {
        "stop_reason": "tool_use",
        "content": [
            {"type": "text", "text": f"Step {step}: looking it up."},
            {"type": "tool_use", "id": f"toolu_{run}_{step:03d}", "name": "lookup",
             "input": {"item": f"widget for {run}", "step": step}},
        ],
        "usage": {"input_tokens": 400 + 60 * step, "output_tokens": 40,
                  "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
    }


def end_turn(run: str = "run-0") -> dict[str, Any]:
    return {
        "stop_reason": "end_turn",
        "content": [{"type": "text", "text": f"All steps of {run} are done."}],
        "usage": {"input_tokens": 1500, "output_tokens": 30,
                  "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
    }


def script(turns: int, run: str = "run-0") -> list[dict[str, Any]]:
    """``turns`` responses: turns-1 tool calls, then end_turn."""
    return [tool_use(step, run) for step in range(1, turns)] + [end_turn(run)]


def turn_of(request: dict[str, Any]) -> int:
    """Which turn a request is: the history holds 2 messages per finished turn, plus the task."""
    return (len(request.get("messages") or ()) + 1) // 2


def run_name_of(request: dict[str, Any]) -> str:
    """The run a request belongs to, read from its task ("<run name>: ...")."""
    first = (request.get("messages") or [{}])[0].get("content")
    if isinstance(first, list):
        first = "".join(b.get("text", "") for b in first if isinstance(b, dict))
    return str(first or "run-0").split(":", 1)[0]


def respond(request: dict[str, Any], turns: int) -> dict[str, Any]:
    """The scripted answer to any request of any run: tool_use until the last turn, then end_turn."""
    run = run_name_of(request)
    turn = turn_of(request)
    return tool_use(turn, run) if turn < turns else end_turn(run)


def task(run: str) -> str:
    return f"{run}: look up every widget, one step at a time."


def scripted_runs(agent: Any, turns: int, runs: int, flush: Any = None) -> Callable[[], float]:
    """A benchmark sample: ``runs`` runs of ``agent`` through the scripted conversation of ``turns`` turns (a fresh
    ScriptedModel each, made before the clock starts), then ``flush()`` if given, so an export is paid inside the
    sample; returns the seconds it took."""
    from looptrace.runtime.models import ScriptedModel

    from .common import clock

    responses, request = script(turns), task("run-0")

    def sample() -> float:
        models = [ScriptedModel(responses) for _ in range(runs)]
        started = clock()
        for model in models:
            agent.client = model
            agent.run(request)
        if flush is not None:
            flush()
        return clock() - started

    return sample

