"""looptrace's pytest plugin (registered as a ``pytest11`` entry point, so installing looptrace is enough).

Fixtures:

* ``looptrace_spans``: a ``looptrace.testing.CapturedSpans``; the spans of the test's runs, in memory.
* ``scripted_agent``: builds an ``Agent`` that replays scripted model responses and records into ``looptrace_spans``::

      def test_books_the_projector(scripted_agent):
          agent = scripted_agent([tool_use("reserve", {"item": "EQ-1"}), final_answer("Booked.")], tools=[reserve])
          result = agent.run("book a projector")
          assert_tool_called(result, "reserve", item="EQ-1")

Helpers to assert with live in ``looptrace.testing``: ``assert_tool_called``, ``assert_no_anomalies``, ``tool_calls``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pytest

from looptrace.testing import CapturedSpans

if TYPE_CHECKING:
    from looptrace.runtime.agent import Agent


@pytest.fixture
def looptrace_spans() -> CapturedSpans:
    """The finished spans of this test's runs, in memory (a tracer provider of the test's own, never global)."""
    return CapturedSpans()


@pytest.fixture
def scripted_agent(looptrace_spans: CapturedSpans) -> Callable[..., Agent]:
    """``scripted_agent(responses, tools=[...], **agent_options)``: an Agent whose model replays ``responses``
    (Messages API response dicts, e.g. from ``tool_use`` and ``final_answer``) and whose spans go to
    ``looptrace_spans``. Any other ``Agent`` option may be passed; ``model`` defaults to a Claude model id."""
    from looptrace.runtime.agent import Agent
    from looptrace.runtime.models import ScriptedModel

    def build(responses: Iterable[dict[str, Any]], *, model: str = "claude-sonnet-5-5", **options: Any) -> Agent:
        options.setdefault("tracer_provider", looptrace_spans.provider)
        return Agent(model, client=ScriptedModel(list(responses)), **options)

    return build
