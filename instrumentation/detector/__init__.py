"""Loop-anomaly detection for agent runs. Pure: standard library only.

The same code runs live inside the agent loop, in a span processor watching someone else's agent, and offline over
stored traces (`looptrace detect`). It is fed one tool call at a time (with its result), told when each turn ends and
when the run ends, and returns anomalies:

    detector = LoopDetector()
    for each turn:            detector.observe(ToolCall(...)) for every tool call, then
                              detector.end_turn(turn)          (also for a turn with no tool calls)
    at the end:               detector.end_run(stop_reason, final_text, turn)

The rules are repeated_call, cycle, failing_tool, ignored_error and repeated_text, one module each; DESIGN.md beside
this file says what each one looks for and why, how a call's identity is made, and what the detector costs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Each public name and the module it lives in. The package loads a module when one of its names is first used, so a
# reader that needs a record type (`looptrace traces show`) does not pay for the rules it never runs.
_HOMES = {
    "answer_addresses": "answers", "draws_on": "answers", "states_operation": "answers",
    "DetectorConfig": "config",
    "ToolErrorFacts": "errors",
    "NONCE_KEYS": "identity", "call_targets": "identity", "canonical_arguments": "identity",
    "normal_text": "identity", "result_digest": "identity",
    "DEFAULT_JUDGE_MAX_CALLS": "judge", "Judge": "judge", "JudgeRequest": "judge", "JudgeSummary": "judge",
    "JudgeVerdict": "judge",
    "LoopCost": "cost", "LoopCostRecord": "cost", "TurnUsage": "cost", "format_usd": "cost",
    "LoopDetector": "loop_detector",
    "SessionDetectors": "session",
    "CYCLE": "types", "FAILING_TOOL": "types", "IGNORED_ERROR": "types", "REPEATED_CALL": "types",
    "REPEATED_TEXT": "types",
    "Anomaly": "types", "AnomalyRecord": "types", "AnomalyType": "types", "FedCall": "types", "ToolCall": "types",
    "UnresolvedToolError": "facts",
}

if TYPE_CHECKING:  # the same names, for type checkers
    from .answers import answer_addresses, draws_on, states_operation
    from .config import DetectorConfig
    from .cost import LoopCost, LoopCostRecord, TurnUsage, format_usd
    from .errors import ToolErrorFacts
    from .facts import UnresolvedToolError
    from .identity import NONCE_KEYS, call_targets, canonical_arguments, normal_text, result_digest
    from .judge import DEFAULT_JUDGE_MAX_CALLS, Judge, JudgeRequest, JudgeSummary, JudgeVerdict
    from .loop_detector import LoopDetector
    from .session import SessionDetectors
    from .types import (
        CYCLE,
        FAILING_TOOL,
        IGNORED_ERROR,
        REPEATED_CALL,
        REPEATED_TEXT,
        Anomaly,
        AnomalyRecord,
        AnomalyType,
        FedCall,
        ToolCall,
    )


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = [
    "CYCLE",
    "DEFAULT_JUDGE_MAX_CALLS",
    "FAILING_TOOL",
    "IGNORED_ERROR",
    "NONCE_KEYS",
    "REPEATED_CALL",
    "REPEATED_TEXT",
    "Anomaly",
    "AnomalyRecord",
    "AnomalyType",
    "DetectorConfig",
    "FedCall",
    "Judge",
    "JudgeRequest",
    "JudgeSummary",
    "JudgeVerdict",
    "LoopCost",
    "LoopCostRecord",
    "LoopDetector",
    "SessionDetectors",
    "ToolCall",
    "ToolErrorFacts",
    "TurnUsage",
    "UnresolvedToolError",
    "answer_addresses",
    "call_targets",
    "canonical_arguments",
    "draws_on",
    "format_usd",
    "normal_text",
    "result_digest",
    "states_operation",
]
