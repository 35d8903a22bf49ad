"""looptrace's loop guard inside other frameworks' agent loops, in process, each through its own extension point.

``core`` (framework-neutral: the detector, the policy, the sinks and the spans) loads with this package; each
framework's adapter loads only when its name is first used, so installing looptrace without an extra imports none of
these frameworks:

    LoopGuardMiddleware     LangChain / LangGraph ``create_agent`` middleware   looptrace[langchain]
    OpenAIAgentsGuard       OpenAI Agents SDK run hooks and tool guardrails     looptrace[openai-agents]
    ClaudeAgentGuard        Claude Agent SDK PreToolUse / PostToolUse hooks     looptrace[claude-agent-sdk]
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .core import GuardedRun, LoopGuard, ModelCall, Reaction

# Each adapter, its module, and the extra that installs its framework.
_ADAPTERS = {
    "LoopGuardMiddleware": ("langchain_guard", "langchain"),
    "OpenAIAgentsGuard": ("openai_agents_guard", "openai-agents"),
    "ClaudeAgentGuard": ("claude_agent_guard", "claude-agent-sdk"),
}

if TYPE_CHECKING:
    from .claude_agent_guard import ClaudeAgentGuard
    from .langchain_guard import LoopGuardMiddleware
    from .openai_agents_guard import OpenAIAgentsGuard


def __getattr__(name: str) -> Any:
    if name not in _ADAPTERS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home, extra = _ADAPTERS[name]
    try:
        module = importlib.import_module(f".{home}", __name__)
    except ImportError as exc:
        raise ImportError(f"{name} needs its framework: pip install 'looptrace[{extra}]' ({exc})") from exc
    value = getattr(module, name)
    globals()[name] = value
    return value


__all__ = ["ClaudeAgentGuard", "GuardedRun", "LoopGuard", "LoopGuardMiddleware", "ModelCall", "OpenAIAgentsGuard",
           "Reaction"]
