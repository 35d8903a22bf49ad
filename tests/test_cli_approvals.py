"""`looptrace run` with tools that need approval: the question at a terminal, the pause without one, `looptrace
resume`, and every bad state or decision refused with one line and exit code 2."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from looptrace.cli.app import main
from looptrace.cli.exit_codes import EXIT_AWAITING_APPROVAL, EXIT_USAGE

TOOLS = '''
from looptrace import tool

@tool(needs_approval=lambda arguments: arguments["amount"] > 100)
def pay(to: str, amount: int) -> str:
    """Send money."""
    with open("payments.log", "a") as log:
        log.write(f"{to} {amount}\\n")
    return f"paid {amount} to {to}"

@tool
def balance() -> str:
    """The balance."""
    return "1200 EUR"
'''


def use(name, call_id, **arguments):
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def asks(*blocks):
    return {"stop_reason": "tool_use", "content": list(blocks)}


@pytest.fixture
def tools_file(workdir):
    path = workdir / "money_tools.py"
    path.write_text(TOOLS)
    return path


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def payments(workdir: Path) -> list[str]:
    log = workdir / "payments.log"
    return log.read_text().splitlines() if log.exists() else []


def paused(capsys, api, tools_file, *extra):
    api.add(asks(use("balance", "t1"), use("pay", "t2", to="Ann", amount=500)))
    code, out, err = run_cli(capsys, "run", "pay Ann 500", "--tools", str(tools_file),
                             "--state-file", "paused.json", *extra)
    return code, out, err


def test_without_a_terminal_the_run_pauses_writes_its_state_and_says_how_to_resume(workdir, api, capsys, tools_file):
    code, out, err = paused(capsys, api, tools_file)
    assert code == EXIT_AWAITING_APPROVAL == 40
    assert "looptrace resume paused.json --approve t2" in err
    assert 't2  pay({"to": "Ann", "amount": 500})' in err
    assert payments(workdir) == []
    api.add({"stop_reason": "end_turn", "content": "Paid Ann."})
    code, out, err = run_cli(capsys, "resume", "paused.json", "--approve", "t2")
    assert code == 0, err
    assert out.strip() == "Paid Ann."
    assert payments(workdir) == ["Ann 500"]
    # the two runs, one session, the decision on the tool line
    code, shown, _ = run_cli(capsys, "traces", "show")
    assert "[approved by person after" in shown
    assert "resumes trace" in shown


def test_resume_with_a_rejection_tells_the_model_why(workdir, api, capsys, tools_file):
    paused(capsys, api, tools_file)
    api.add({"stop_reason": "end_turn", "content": "Not paid."})
    code, _, err = run_cli(capsys, "resume", "paused.json", "--reject", "t2=Ann was paid on Monday")
    assert code == 0, err
    result = api.requests[-1]["messages"][-1]["content"][1]
    assert result["is_error"] is True and "Ann was paid on Monday" in result["content"]
    assert payments(workdir) == []


def test_approve_flags_skip_the_question(workdir, api, capsys, tools_file):
    api.add(asks(use("pay", "t1", to="Ann", amount=500)), {"stop_reason": "end_turn", "content": "ok"})
    code, _, err = run_cli(capsys, "run", "pay", "--tools", str(tools_file), "--approve", "pay")
    assert code == 0, err
    api.add(asks(use("pay", "t2", to="Bob", amount=700)), {"stop_reason": "end_turn", "content": "ok"})
    code, _, err = run_cli(capsys, "run", "pay", "--tools", str(tools_file), "--approve-all")
    assert code == 0, err
    assert payments(workdir) == ["Ann 500", "Bob 700"]


BAD_DECISIONS = [
    (["--approve", "t9"], "call 't9' is not pending"),
    ([], "waits for a decision"),
    (["--reject", "t2"], "--reject takes ID=REASON"),
    (["--approve", "t2", "--go-on"], "no anomaly waits"),
    (["--go-on", "--stop"], "choose one"),
    (["--approve", "t2", "--reject", "t2=no"], "both approved and rejected"),
]


def test_a_bad_decision_is_one_line_and_exit_2_with_nothing_run(workdir, api, capsys, tools_file):
    paused(capsys, api, tools_file)
    requests = len(api.requests)
    for argv, says in BAD_DECISIONS:
        code, out, err = run_cli(capsys, "resume", "paused.json", *argv)
        assert (code, out) == (EXIT_USAGE, ""), argv
        assert err.count("\n") == 1 and says in err, (argv, err)
    assert len(api.requests) == requests and payments(workdir) == []
    # nothing lost: the state still resumes
    api.add({"stop_reason": "end_turn", "content": "ok"})
    assert run_cli(capsys, "resume", "paused.json", "--approve", "t2")[0] == 0


def test_a_bad_state_is_one_line_and_exit_2(workdir, api, capsys, tools_file):
    paused(capsys, api, tools_file)
    state = json.loads(Path("paused.json").read_text())
    cases = {
        "missing.json": None,
        "corrupt.json": Path("paused.json").read_text()[:300],
        "other-version.json": json.dumps(state | {"version": 2}),
        "other-agent.json": json.dumps(state | {"agent": "billing"}),
        "not-a-state.json": "[1, 2, 3]",
    }
    for name, text in cases.items():
        if text is not None:
            Path(name).write_text(text)
        code, out, err = run_cli(capsys, "resume", name, "--approve", "t2")
        assert (code, out) == (EXIT_USAGE, ""), (name, err)
        assert err.count("\n") == 1 and err.startswith("looptrace: error: "), (name, err)
    api.add({"stop_reason": "end_turn", "content": "ok"})
    assert run_cli(capsys, "resume", "paused.json", "--approve", "t2")[0] == 0
    code, _, err = run_cli(capsys, "resume", "paused.json", "--approve", "t2")
    assert code == EXIT_USAGE and "resumed already" in err and err.count("\n") == 1
    assert payments(workdir) == ["Ann 500"]


def test_on_anomaly_ask_pauses_and_resume_goes_on_or_stops(workdir, api, capsys, tools_file):
    loop = [asks(use("balance", f"b{n}")) for n in range(1, 4)]
    api.add(*loop)
    code, _, err = run_cli(capsys, "run", "check", "--tools", str(tools_file), "--on-anomaly", "ask",
                           "--state-file", "asked.json")
    assert code == EXIT_AWAITING_APPROVAL, err
    assert "repeated_call anomaly asks whether to go on" in err
    api.add({"stop_reason": "end_turn", "content": "1200 EUR"})
    code, out, err = run_cli(capsys, "resume", "asked.json", "--go-on", "--message", "stop checking, answer")
    assert code == 0, err
    assert api.requests[-1]["messages"][-1]["content"][-1]["text"] == "stop checking, answer"
    api.add(*loop)
    run_cli(capsys, "run", "check", "--tools", str(tools_file), "--on-anomaly", "ask", "--state-file", "again.json")
    requests = len(api.requests)
    code, _, err = run_cli(capsys, "resume", "again.json", "--stop")
    assert code == 30 and len(api.requests) == requests


# --- at a terminal ---------------------------------------------------------------------------------------------------


def read_until(master: int, text: str, seen: bytearray, times: int = 1) -> None:
    """Read the terminal until ``text`` appears (the process is expected to print it; no wall-clock bound: a test
    that hangs is stopped by the suite's own timeout, not by guessing how fast this machine is)."""
    while seen.count(text.encode()) < times:
        ready, _, _ = select.select([master], [], [], 60)
        if ready:
            chunk = os.read(master, 4096)
            if not chunk:
                raise AssertionError(f"the terminal closed before {text!r}: {seen.decode(errors='replace')}")
            seen.extend(chunk)


@pytest.mark.slow
def test_the_question_is_answered_at_a_terminal(workdir, api, tools_file):
    api.add(asks(use("pay", "t1", to="Ann", amount=500), use("pay", "t2", to="Bob", amount=900)),
            asks(use("pay", "t3", to="Cy", amount=300)),
            asks(use("pay", "t4", to="Di", amount=400)),
            {"stop_reason": "end_turn", "content": "done"})
    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "looptrace", "run", "pay everyone", "--tools", str(tools_file)],
                               stdin=slave, stderr=slave, stdout=subprocess.PIPE, cwd=workdir, env=os.environ.copy())
    os.close(slave)
    seen = bytearray()
    try:
        read_until(master, '{"to": "Ann", "amount": 500}', seen)
        read_until(master, "approve?", seen)
        os.write(master, b"y\n")
        read_until(master, '{"to": "Bob", "amount": 900}', seen)
        os.write(master, b"n\n")
        read_until(master, "reason", seen)
        os.write(master, b"Bob left the company\n")
        read_until(master, '{"to": "Cy", "amount": 300}', seen)
        read_until(master, "approve?", seen, times=3)
        os.write(master, b"a\n")  # always approve pay: Di's call is not asked about
        out, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
        os.close(master)
    assert process.returncode == 0, seen.decode(errors="replace")
    assert out.decode().strip() == "done"
    assert seen.decode().count("approve?") == 3
    assert payments(workdir) == ["Ann 500", "Cy 300", "Di 400"]
    rejected = next(b for b in api.requests[1]["messages"][-1]["content"] if b.get("tool_use_id") == "t2")
    assert rejected["is_error"] and "Bob left the company" in rejected["content"]
