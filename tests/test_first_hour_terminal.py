"""At a terminal (a pseudo-terminal here): the questions looptrace asks stay on the screen until they are answered,
and a streaming model's text shows as it arrives (issue 43, items 1, 7 and 12)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from fakes.messages_api import Held
from terminal import Terminal

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "looptrace"]
LIVE_LINE = b"\x1b[K"  # how the live view rewrites its line in place

BOOKING_TOOLS = textwrap.dedent('''
    import time
    from pathlib import Path

    from looptrace import tool


    @tool(needs_approval=True)
    def book(room: str) -> str:
        """Book a room.

        Args:
            room: Which room.
        """
        deadline = time.monotonic() + 60
        while not Path("go").exists() and time.monotonic() < deadline:  # the test says when the booking is done
            time.sleep(0.02)
        return f"booked {room}"
''')
BOOKING_SCRIPT = [
    {"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "toolu_1", "name": "book",
                                             "input": {"room": "A"}}]},
    {"stop_reason": "end_turn", "content": [{"type": "text", "text": "Booked room A."}]},
]


def environment(tmp_path, **extra: str) -> dict[str, str]:
    """No key (the runs here need none), no backend: the trace file goes to the test's directory."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(("ANTHROPIC_", "LANGFUSE_"))}
    return {**env, **extra}


def test_the_approval_question_stays_on_the_screen_until_it_is_answered(tmp_path):
    (tmp_path / "tools.py").write_text(BOOKING_TOOLS)
    (tmp_path / "script.json").write_text(json.dumps(BOOKING_SCRIPT))
    terminal = Terminal([*CLI, "run", "Book room A", "--tools", "tools.py", "--model", "scripted:script.json"],
                        cwd=tmp_path, env=environment(tmp_path))
    try:
        terminal.read_until("approve? [y]es")
        # The live line ticks every quarter second while the run waits: four ticks' worth, and not one drawn over
        # the question.
        while_asked = terminal.read_for(1.0)
        assert LIVE_LINE not in while_asked and "…".encode() not in while_asked, while_asked
        terminal.type("y\n")
        # Once answered, the live line is back, counting the tool's time (the tool waits for the test meanwhile).
        terminal.read_until("… running book")
        (tmp_path / "go").touch()
        assert terminal.wait() == 0, terminal.text()
    finally:
        terminal.close()
    screen = terminal.text()
    question = screen.index("looptrace: book wants to run")
    assert screen.index('{"room": "A"}', question) < screen.index("approve? [y]es", question)
    assert "Booked room A." in screen


def test_demo_on_anomaly_ask_asks_at_the_terminal_and_goes_on_with_the_answer(tmp_path):
    terminal = Terminal([*CLI, "demo", "runaway", "--on-anomaly", "ask"], cwd=tmp_path, env=environment(tmp_path))
    try:
        terminal.read_until("go on? [y]es / [m]essage the model and go on / [s]top")
        assert LIVE_LINE not in terminal.read_for(0.6)
        terminal.type("s\n")
        code = terminal.wait()
    finally:
        terminal.close()
    screen = terminal.text()
    assert code == 30, screen  # stopped_by_detector: the person said stop
    assert "the run paused on a repeated_call anomaly" in screen
    assert "state written" not in screen and "looptrace resume" not in screen  # nothing left to resume


def test_demo_on_anomaly_ask_without_a_terminal_is_refused_before_it_runs(tmp_path):
    completed = subprocess.run([*CLI, "demo", "runaway", "--on-anomaly", "ask"], cwd=tmp_path,
                               env=environment(tmp_path), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=120)
    assert completed.returncode == 2, completed.stderr
    assert completed.stdout == ""
    assert completed.stderr.startswith("looptrace: error: demo --on-anomaly ask asks at the terminal")
    assert len(completed.stderr.strip().splitlines()) == 1
    assert not (tmp_path / ".looptrace").exists()  # nothing ran


def test_a_streaming_model_call_shows_its_text_before_the_call_ends(tmp_path, api):
    answer = "Streaming works: this sentence reaches the screen piece by piece."
    held = Held({"content": [{"type": "text", "text": answer}]}, after_events=4)  # start, block, ping, 1st piece
    api.add(held)
    process = subprocess.Popen([*CLI, "run", "Say something", "--stream"], cwd=tmp_path, env=environment(
        tmp_path, ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY="test-key"), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        seen = b""
        while answer[:12].encode() not in seen:  # the first piece, while the rest of the answer is held back
            chunk = os.read(process.stderr.fileno(), 4096)
            assert chunk, f"the call ended without showing its text first: {seen!r}"
            seen += chunk
        assert not held.release.is_set() and not held.expired.is_set()  # the call is still streaming
        assert b"  says    " + answer[:12].encode() in seen
        held.release.set()
        out, err = process.communicate(timeout=120)
    finally:
        held.release.set()
        if process.poll() is None:
            process.kill()
            process.communicate()
    shown = (seen + err).decode()
    assert process.returncode == 0, shown
    assert out.decode().strip() == answer
    assert f"  says    {answer}\n  model   stop_reason=end_turn" in shown  # once, whole, then the call's line
    assert shown.count(answer[:12]) == 1
