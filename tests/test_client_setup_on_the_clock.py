"""When looptrace builds the Anthropic client itself (an Agent without client=, as the CLI's), the client's set-up
is on the run's clock: it counts against timeout_s and lies inside the run's span, before its first turn, so that
neither the first model call's duration (its chat span, the Langfuse generation, the live view's line, the latency
panel) nor its turn includes it. The set-up is made slow on purpose here (the first run of a process pays for
importing the SDK)."""

from __future__ import annotations

import threading
import time

import anthropic
import pytest

from looptrace import Agent, Limits
from looptrace.testing import CapturedSpans

SET_UP_S = 0.5  # how long the client's set-up takes in these tests


class SlowToBuild(anthropic.Anthropic):
    """The first client of a process is slow to make (the SDK's import and set-up); its copies (with_options) not."""

    built = 0
    built_at_ns = 0  # when the first one was ready, on the clock spans use

    def __init__(self, *args, **kwargs) -> None:
        if not SlowToBuild.built:
            time.sleep(SET_UP_S)
        SlowToBuild.built += 1
        super().__init__(*args, **kwargs)
        if SlowToBuild.built == 1:
            SlowToBuild.built_at_ns = time.time_ns()


@pytest.fixture
def slow_client(monkeypatch):
    monkeypatch.setattr(SlowToBuild, "built", 0)
    monkeypatch.setattr(anthropic, "Anthropic", SlowToBuild)


class TooSlowToBuild(anthropic.Anthropic):
    """A set-up far slower than the run's limit (a cold import on a loaded machine)."""

    SET_UP_S = 20.0
    started = threading.Event()
    finished = threading.Event()

    def __init__(self, *args, **kwargs) -> None:
        TooSlowToBuild.started.set()
        TooSlowToBuild.finished.wait(self.SET_UP_S)  # the test ends the wait once it has looked
        super().__init__(*args, **kwargs)


def test_the_client_set_up_counts_against_timeout_s(api, monkeypatch):
    monkeypatch.setattr(anthropic, "Anthropic", TooSlowToBuild)
    TooSlowToBuild.started.clear()
    TooSlowToBuild.finished.clear()
    spans = CapturedSpans()
    try:
        result = Agent("claude-sonnet-5-5", limits=Limits(timeout_s=0.5), tracer_provider=spans.provider).run("hi")
        # The mechanism, not a duration: the run ended on its limit while its client was still being built.
        assert TooSlowToBuild.started.is_set() and not TooSlowToBuild.finished.is_set()
    finally:
        TooSlowToBuild.finished.set()
    assert result.status.value == "timeout" and result.turns == 0, (result.status, result.error)
    assert spans.one("invoke_agent").attributes["looptrace.run.status"] == "timeout"
    assert api.requests == []  # nothing was sent on a clock that had run out


def test_the_client_is_built_inside_the_run_before_its_first_turn(api, slow_client):
    api.add({"content": [{"type": "text", "text": "hello"}]})
    spans = CapturedSpans()
    turns_started_ns = []

    def watch(event):
        if type(event).__name__ == "TurnStarted":
            turns_started_ns.append(time.time_ns())

    result = Agent("claude-sonnet-5-5", tracer_provider=spans.provider, on_event=watch).run("hi")
    assert result.status.value == "done"
    root, turn, chat = spans.one("invoke_agent"), spans.one("turn"), spans.one("chat")
    built = SlowToBuild.built_at_ns
    # The order of events, not their durations: the set-up ran inside the run, and was over before the turn (its
    # span, and the live view's timing of the model call, which starts at TurnStarted) and the chat span began.
    assert root.start_time <= built - SET_UP_S * 1e9
    assert built <= turn.start_time <= chat.start_time
    assert built <= turns_started_ns[0]


def test_the_first_chat_span_still_says_where_the_call_went(api, slow_client):
    api.add({"content": [{"type": "text", "text": "hello"}]}, {"content": [{"type": "text", "text": "again"}]})
    spans = CapturedSpans()
    agent = Agent("claude-sonnet-5-5", tracer_provider=spans.provider)
    agent.run("hi")
    agent.run("hi again")
    port = int(api.url.rsplit(":", 1)[1].split("/")[0])
    assert [(c.attributes.get("server.address"), c.attributes.get("server.port")) for c in spans.named("chat")] == [
        ("127.0.0.1", port)] * 2
