"""Loop-anomaly detection for agent runs. Pure: standard library only.

The same code runs live inside the agent loop, in a span processor watching someone else's agent, and offline over
stored traces (`looptrace detect`). It is fed one tool call at a time (with its result), told when each turn ends and
when the run ends, and returns anomalies:

    detector = LoopDetector()
    for each turn:            detector.observe(ToolCall(...)) for every tool call, then
                              detector.end_turn(turn)          (also for a turn with no tool calls)
    at the end:               detector.end_run(stop_reason, final_text, turn)

The rules are repeated_call, cycle, failing_tool and ignored_error, one module each; DESIGN.md beside this file says
what each one looks for and why, how a call's identity is made, and what the detector costs.
"""

from .answers import answer_addresses, draws_on, states_operation
from .config import DetectorConfig
from .errors import ToolErrorFacts, UnresolvedToolError
from .identity import NONCE_KEYS, call_targets, canonical_arguments, normal_text, result_digest
from .judge import DEFAULT_JUDGE_MAX_CALLS, Judge, JudgeRequest, JudgeSummary, JudgeVerdict
from .loop_detector import LoopDetector
from .session import SessionDetectors
from .types import CYCLE, FAILING_TOOL, IGNORED_ERROR, REPEATED_CALL, Anomaly, AnomalyRecord, AnomalyType, ToolCall

__all__ = [
    "CYCLE",
    "DEFAULT_JUDGE_MAX_CALLS",
    "FAILING_TOOL",
    "IGNORED_ERROR",
    "NONCE_KEYS",
    "REPEATED_CALL",
    "Anomaly",
    "AnomalyRecord",
    "AnomalyType",
    "DetectorConfig",
    "Judge",
    "JudgeRequest",
    "JudgeSummary",
    "JudgeVerdict",
    "LoopDetector",
    "SessionDetectors",
    "ToolCall",
    "ToolErrorFacts",
    "UnresolvedToolError",
    "answer_addresses",
    "call_targets",
    "canonical_arguments",
    "draws_on",
    "normal_text",
    "result_digest",
    "states_operation",
]
