"""What an observer sees while a run goes on: pass `on_event=` to an Agent to watch turns as they happen.

The CLI's live view is built on these and nothing else. Observers run on the loop's thread, so keep them quick; one
that raises is logged and otherwise ignored, never allowed to break the run. More kinds of event may come in later
releases: an observer ignores the ones it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from looptrace.runtime.result import RunResult, Usage


@dataclass(frozen=True, slots=True)
class TurnStarted:
    """A turn began: the model is about to be called for the ``turn``-th time (from 1)."""

    turn: int


@dataclass(frozen=True, slots=True)
class TextStreamed:
    """A piece of the model's text as it streams in (only from a model that streams, such as
    ``AnthropicModel(stream=True)``); ``ModelResponded`` follows with the whole response. It may come from the thread
    the model call runs on."""

    turn: int
    text: str


@dataclass(frozen=True, slots=True)
class ModelResponded:
    """The model answered: why it stopped, what it cost in tokens, what it said and which tools it asked for."""

    turn: int
    stop_reason: str | None
    usage: Usage
    text: str
    tool_calls: tuple[tuple[str, Any], ...]  # (name, arguments) per tool_use block, in order
    duration_s: float


@dataclass(frozen=True, slots=True)
class ToolFinished:
    """A tool call settled: its result as the model will read it (truncated if long), and how it ended."""

    turn: int
    call_id: str
    name: str
    arguments: Any  # secrets redacted, as on the spans
    result: str
    is_error: bool
    outcome: str  # ok | error | timeout | invalid_arguments | unknown_tool | rejected
    duration_s: float


@dataclass(frozen=True, slots=True)
class AnomalyDetected:
    """The loop detector flagged ``anomaly`` (a ``looptrace.Anomaly``) and the policy chose ``action``."""

    anomaly: Any
    action: str  # warn | nudge | ask | stop


@dataclass(frozen=True, slots=True)
class RunFinished:
    """The run ended; ``result`` is what ``Agent.run`` returns."""

    result: RunResult


Event = TurnStarted | TextStreamed | ModelResponded | ToolFinished | AnomalyDetected | RunFinished
