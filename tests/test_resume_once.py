"""A paused run resumes once, per run and not per file name, and a resume that cannot go ahead says so in one line and
keeps the state; each checked with `looptrace resume` (or Agent.resume) in processes of their own.

The approved call is a payment: it lands in payments.log, so "resumed twice" reads as "paid twice".
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from looptrace.cli.exit_codes import EXIT_AWAITING_APPROVAL, EXIT_USAGE

pytestmark = pytest.mark.slow

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
MCP_SERVER = Path(__file__).parent / "data" / "mcp_test_server.py"
PATIENCE_S = 120  # how long a process may take on a busy machine; never a bound on how fast


def use(name, call_id, **arguments):
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def paying(to="Ann", amount=500, call_id="t2"):
    return {"stop_reason": "tool_use", "content": [use("balance", "t1"), use("pay", call_id, to=to, amount=amount)]}


DONE = {"stop_reason": "end_turn", "content": "Paid."}


def looptrace(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """The CLI in a process of its own, without a terminal (so a call that needs approval pauses the run)."""
    return subprocess.run([sys.executable, "-m", "looptrace", *argv], cwd=cwd, env=os.environ.copy(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=PATIENCE_S)


def started(*argv: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "looptrace", *argv], cwd=cwd, env=os.environ.copy(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def payments(workdir: Path) -> list[str]:
    log = workdir / "payments.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def tools_file(workdir):
    path = workdir / "money_tools.py"
    path.write_text(TOOLS)
    return path


def pause(api, workdir, tools_file, state="paused.json", *extra: str, **paid) -> Path:
    api.add(paying(**paid))
    done = looptrace("run", "pay Ann", "--tools", str(tools_file), "--state-file", state, *extra, cwd=workdir)
    assert done.returncode == EXIT_AWAITING_APPROVAL, done.stderr
    return workdir / state


# --- once per paused run ---------------------------------------------------------------------------------------------


def test_a_paused_run_resumes_once_through_a_symlink_a_hard_link_or_a_copy(workdir, api, tools_file):
    state = pause(api, workdir, tools_file)
    elsewhere = workdir / "elsewhere"
    elsewhere.mkdir()
    (workdir / "link.json").symlink_to(state)
    os.link(state, workdir / "hard.json")
    shutil.copy(state, elsewhere / "copy.json")
    api.add(DONE, DONE, DONE, DONE)
    first = looptrace("resume", "paused.json", "--approve", "t2", cwd=workdir)
    assert first.returncode == 0, first.stderr
    for name in ("link.json", "hard.json", str(elsewhere / "copy.json"), "paused.json"):
        again = looptrace("resume", name, "--approve", "t2", cwd=workdir)
        assert again.returncode == EXIT_USAGE, (name, again.stderr)
        assert "resumed already" in again.stderr and again.stderr.count("\n") == 1, again.stderr
        assert str(state) in again.stderr  # where it was resumed from, for whoever wonders
    assert payments(workdir) == ["Ann 500"]


def test_two_processes_resuming_two_copies_at_once_pay_once(workdir, api, tools_file):
    state = pause(api, workdir, tools_file)
    shutil.copy(state, workdir / "copy.json")
    api.add(DONE, DONE)
    racing = [started("resume", name, "--approve", "t2", cwd=workdir) for name in ("paused.json", "copy.json")]
    outcomes = [(process.wait(timeout=PATIENCE_S), process.communicate()[1]) for process in racing]
    assert sorted(code for code, _ in outcomes) == [0, EXIT_USAGE], outcomes
    assert any("resumed already" in err for _, err in outcomes)
    assert payments(workdir) == ["Ann 500"]


def test_its_json_resumed_by_the_library_in_another_process_is_refused_too(workdir, api, tools_file):
    pause(api, workdir, tools_file)
    api.add(DONE, DONE)
    assert looptrace("resume", "paused.json", "--approve", "t2", cwd=workdir).returncode == 0
    script = textwrap.dedent('''
        import json, sys
        import anthropic
        from looptrace import Agent, StateError
        sys.path.insert(0, ".")
        import money_tools

        data = json.load(open("paused.json"))
        agent = Agent(data["model"], tools=[money_tools.pay, money_tools.balance],
                      client=anthropic.Anthropic(max_retries=0))
        try:
            agent.resume(data, approve=["t2"])
        except StateError as exc:
            print("refused:", exc)
    ''')
    done = subprocess.run([sys.executable, "-c", script], cwd=workdir, env=os.environ.copy(), capture_output=True,
                          text=True, timeout=PATIENCE_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused:") and "resumed already" in done.stdout
    assert payments(workdir) == ["Ann 500"]


def test_a_state_file_path_used_again_holds_a_new_run_that_resumes(workdir, api, tools_file):
    pause(api, workdir, tools_file)
    api.add(DONE)
    assert looptrace("resume", "paused.json", "--approve", "t2", cwd=workdir).returncode == 0
    pause(api, workdir, tools_file, amount=700)  # the same --state-file, a new paused run
    api.add(DONE)
    again = looptrace("resume", "paused.json", "--approve", "t2", cwd=workdir)
    assert again.returncode == 0, again.stderr
    assert payments(workdir) == ["Ann 500", "Ann 700"]


def test_the_readme_approvals_snippet_runs_twice(tmp_path):
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("## A person in the loop", 1)[1].split("\n## ", 1)[0]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert ".save(" in snippet and ".resume(" in snippet
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_", "LANGFUSE_"))}
    env["LOOPTRACE_EXPORTER"] = "none"
    for _ in range(2):  # the second time, the same state file path holds another paused run
        done = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=PATIENCE_S)
        assert done.returncode == 0, done.stderr


# --- a resume that cannot go ahead -------------------------------------------------------------------------------------


def edited(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_a_damaged_state_is_one_line_exit_2_and_kept(workdir, api, tools_file):
    state = pause(api, workdir, tools_file)
    good = state.read_text()
    damages = {
        "a detector-feed entry that is no object": lambda d: d["detector_feed"].insert(0, "x"),
        "max_turns as text": lambda d: d["app"]["cli"].update(max_turns="5"),
        "the tools file as a number": lambda d: d["app"]["cli"].update(tools=5),
        "an anomaly that is no object": lambda d: d["anomalies"].append([1]),
        "a state id that names another file": lambda d: d.update(state_id="../../x"),
    }
    for what, damage in damages.items():
        state.write_text(good)
        edited(state, damage)
        done = looptrace("resume", "paused.json", "--approve", "t2", cwd=workdir)
        assert (done.returncode, done.stdout) == (EXIT_USAGE, ""), (what, done.stderr)
        assert done.stderr.startswith("looptrace: error: ") and done.stderr.count("\n") == 1, (what, done.stderr)
    assert payments(workdir) == []
    state.write_text(good)  # mended: nothing above used the state up
    api.add(DONE)
    assert looptrace("resume", "paused.json", "--approve", "t2", cwd=workdir).returncode == 0
    assert payments(workdir) == ["Ann 500"]


def test_a_paused_runs_mcp_server_that_cannot_start_any_more_is_one_line_and_the_state_is_kept(workdir, api,
                                                                                               tools_file):
    server = workdir / "server.py"
    shutil.copy(MCP_SERVER, server)
    pause(api, workdir, tools_file, "paused.json", "--mcp", f"{sys.executable} {server} stdio")
    server.rename(workdir / "away.py")  # uninstalled meanwhile
    done = looptrace("resume", "paused.json", "--approve", "t2", cwd=workdir)
    assert (done.returncode, done.stdout) == (EXIT_USAGE, ""), done.stderr
    assert done.stderr.count("\n") == 1 and "cannot start" in done.stderr and "kept" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and payments(workdir) == []
    (workdir / "away.py").rename(server)  # back: the state was not used up
    api.add(DONE)
    again = looptrace("resume", "paused.json", "--approve", "t2", cwd=workdir)
    assert again.returncode == 0, again.stderr
    assert payments(workdir) == ["Ann 500"]


def test_resume_on_a_fifo_is_refused_at_once(workdir):
    fifo = workdir / "state.fifo"
    os.mkfifo(fifo)
    process = started("resume", str(fifo), "--approve", "t2", cwd=workdir)
    try:
        _, err = process.communicate(timeout=PATIENCE_S)  # before the fix: blocked in open() for ever
    finally:
        process.kill()
    assert process.returncode == EXIT_USAGE and "FIFO" in err and err.count("\n") == 1, err


# --- the call that runs is the call that was approved --------------------------------------------------------------


def test_a_pending_call_changed_after_the_pause_is_refused(workdir, api, tools_file):
    state = pause(api, workdir, tools_file)
    good = state.read_text()

    def last_call(data):
        return data["messages"][-1]["content"][1]

    changes = {
        "the amount that runs": lambda d: last_call(d)["input"].update(amount=50_000),
        "the tool that runs": lambda d: last_call(d).update(name="balance"),
        "the tool shown as pending": lambda d: d["pending"][0].update(tool="balance"),
        "the amount, the digest gone": lambda d: (last_call(d)["input"].update(amount=50_000),
                                                  d["pending"][0].pop("input_sha256")),
    }
    for what, change in changes.items():
        state.write_text(good)
        edited(state, change)
        done = looptrace("resume", "paused.json", "--approve", "t2", cwd=workdir)
        assert done.returncode == EXIT_USAGE and done.stderr.count("\n") == 1, (what, done.stderr)
        assert "changed after the pause" in done.stderr, (what, done.stderr)
    assert payments(workdir) == []
    state.write_text(good)
    api.add(DONE)
    assert looptrace("resume", "paused.json", "--approve", "t2", cwd=workdir).returncode == 0
    assert payments(workdir) == ["Ann 500"]


def test_paused_states_are_private_and_so_is_the_folder_they_go_to(workdir, api, tools_file):
    api.add(paying())
    done = looptrace("run", "pay Ann", "--tools", str(tools_file), cwd=workdir)
    assert done.returncode == EXIT_AWAITING_APPROVAL, done.stderr
    (state,) = (workdir / ".looptrace" / "paused").iterdir()
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((workdir / ".looptrace").stat().st_mode) == 0o700


def test_claims_live_in_a_private_folder_under_xdg_state_home(workdir, api, tools_file, monkeypatch):
    home = workdir / "state-home"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    state = pause(api, workdir, tools_file)
    api.add(DONE)
    assert looptrace("resume", "paused.json", "--approve", "t2", cwd=workdir).returncode == 0
    folder = home / "looptrace" / "resumed"
    (claim,) = folder.iterdir()
    assert claim.name == json.loads(state.read_text())["state_id"]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and stat.S_IMODE(claim.stat().st_mode) == 0o600
    assert "Ann" not in claim.read_text()  # when, which process, from where: nothing of the conversation
    pause(api, workdir, tools_file, "again.json")  # another paused run, resumed while the folder is open to all
    folder.chmod(0o777)  # a folder another user could write in cannot be trusted to hold the claims
    try:
        done = looptrace("resume", "again.json", "--approve", "t2", cwd=workdir)
    finally:
        folder.chmod(0o700)
    assert done.returncode == EXIT_USAGE and "other users" in done.stderr and done.stderr.count("\n") == 1, \
        done.stderr
    assert payments(workdir) == ["Ann 500"]
