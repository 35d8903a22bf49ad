"""looptrace's agent runtime: the loop, its tools, its limits and what a run returns."""

from .agent import Agent, RunInterrupted
from .events import AnomalyDetected, Event, ModelResponded, RunFinished, ToolFinished, TurnStarted
from .limits import Limits
from .models import AnthropicModel, Model, ScriptedModel
from .pricing import Price
from .result import RunResult, RunStatus, Usage
from .tools import Tool, tool

__all__ = [
    "Agent", "AnomalyDetected", "AnthropicModel", "Event", "Limits", "Model", "ModelResponded", "Price",
    "RunFinished", "RunInterrupted", "RunResult", "RunStatus", "ScriptedModel", "Tool", "ToolFinished",
    "TurnStarted", "Usage", "tool",
]
