"""The detector on runs shaped like coding agents: one shell tool whose commands are the operations, failures that
come back, answers that claim a failed commit, test run or deploy as done, honest endings, text loops that are loops.

Through Agent with a scripted model and real tools that raise their own errors: `bash` runs nothing but answers the
way bash does, the command's output and its exit code, as an `is_error` result when the code is not 0. Every run here
that records spans is also read back by `looptrace detect` (conftest.py compares the two).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from looptrace.cli.app import main
from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.detector import FAILING_TOOL, IGNORED_ERROR, REPEATED_CALL, REPEATED_TEXT
from looptrace.runtime import Agent, Limits, RunStatus, ScriptedModel, tool
from looptrace.runtime.tools import ToolError

MODEL = "claude-sonnet-5-5"
CLAIMED_DONE = "the answer states the failed operation as done"
_IDS = itertools.count()

HOOK_FAILED = ("black....................................................................Failed\n"
               "- hook id: black\n- files were modified by this hook\n\nreformatted src/parser.py\n")
TESTS_FAILED = ("F...                                                                     [100%]\n"
                "FAILED tests/test_parser.py::test_total - assert 9 == 10\n1 failed, 3 passed in 0.21s")
DEPLOY_FAILED = "deploying billing to prod...\nerror: health check failed on 2 of 3 instances, rolled back"
PUSH_REJECTED = " ! [rejected]        main -> main (fetch first)\nerror: failed to push some refs"


def shell(outcome: Callable[[str], tuple[int, str]]) -> object:
    """A `bash` tool that runs nothing: `outcome(command)` gives the exit code and output it answers with."""

    @tool
    def bash(command: str) -> str:
        """Run a shell command and return its output and exit code."""
        code, output = outcome(command)
        if code != 0:
            raise ToolError(f"{output}\nexit code {code}")
        return f"{output}\nexit code 0"

    return bash


def failing(*failures: tuple[str, str], exit_code: int = 1) -> Callable[[str], tuple[int, str]]:
    """Commands that hold one of the texts fail with its output; every other command succeeds."""
    def outcome(command: str) -> tuple[int, str]:
        for text, output in failures:
            if text in command:
                return exit_code, output
        return 0, ""
    return outcome


@tool
def edit_file(path: str, old: str, new: str) -> str:
    """Replace text in a file."""
    return f"edited {path}"


def calls(*pairs: tuple[str, dict]) -> dict:
    return {"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": f"toolu_{next(_IDS)}", "name": name, "input": arguments}
        for name, arguments in pairs]}


def says(text: str, *pairs: tuple[str, dict]) -> dict:
    """Text beside tool calls (or, without calls, the final answer)."""
    if not pairs:
        return {"stop_reason": "end_turn", "content": [{"type": "text", "text": text}]}
    response = calls(*pairs)
    response["content"].insert(0, {"type": "text", "text": text})
    return response


def run(script: list[dict], tools: list, spans=None, **options):
    options.setdefault("on_anomaly", "warn")
    agent = Agent(MODEL, tools=tools, client=ScriptedModel(script), limits=Limits(max_turns=40),
                  alerts=Alerts(log_warnings=False), telemetry=spans is not None,
                  tracer_provider=spans.provider if spans is not None else None, **options)
    result = agent.run("fix the parser and ship it")
    assert result.status is RunStatus.DONE, result.status
    return result


def kinds(result) -> list[str]:
    return [a.type for a in result.anomalies]


def bash(command: str) -> tuple[str, dict]:
    return ("bash", {"command": command})


def edit(n: int) -> tuple[str, dict]:
    return ("edit_file", {"path": "src/parser.py", "old": f"v{n}", "new": f"v{n + 1}"})


# --------------------------------------------------------------------------- 1. claims of a failed operation


def _git_commit_tool() -> object:
    @tool
    def git_commit(message: str, no_verify: bool = False) -> str:
        """Commit the staged changes."""
        raise ToolError(HOOK_FAILED)
    return git_commit


COMMIT = ("git_commit", {"message": "fix parser"})

# (what fails, the tools, the failing call, a false claim of it)
SHAPES = {
    "git_commit tool, hook fails": (_git_commit_tool, COMMIT, "All changes are committed."),
    "bash git commit exits 1": (lambda: shell(failing(("git commit", HOOK_FAILED))), bash("git commit -m fix"),
                                "Committed the fix."),
    "bash pytest exits 1": (lambda: shell(failing(("pytest", TESTS_FAILED))), bash("pytest -q"),
                            "All tests pass now."),
    "bash pytest exits 1, the suite green": (lambda: shell(failing(("pytest", TESTS_FAILED))),
                                             bash("cd /code && python -m pytest -q tests/ 2>&1 | tail -20"),
                                             "The test suite is green."),
    "bash deploy script exits 1": (lambda: shell(failing(("./deploy.sh", DEPLOY_FAILED))), bash("./deploy.sh prod"),
                                   "Deployed to production."),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_single_failure_right_before_a_claim_of_it_fires_without_a_judge(shape, spans):
    make, failed, claim = SHAPES[shape]
    result = run([calls(failed), says(claim)], [make()], spans)
    (anomaly,) = result.anomalies
    assert (anomaly.type, anomaly.evidence, anomaly.turn) == (IGNORED_ERROR, CLAIMED_DONE, 2)
    assert result.judge.calls == 0  # no judge configured, none needed


@pytest.mark.parametrize("shape", SHAPES)
def test_five_failed_attempts_with_edits_between_then_a_claim_fires(shape):
    make, failed, claim = SHAPES[shape]
    script = [step for n in range(5) for step in (calls(failed), calls(edit(n)))][:-1] + [says(claim)]
    result = run(script, [make(), edit_file])
    assert kinds(result) == [REPEATED_CALL, IGNORED_ERROR]
    assert result.anomalies[-1].evidence == CLAIMED_DONE


HONEST = [
    "Unable to commit because the hook fails.",
    "The commit didn't go through.",
    "Tests still fail; I could not fix it.",
    "I wasn't able to deploy.",
    "I couldn't push: the remote rejects it.",
    "I wasn't able to commit the change.",
    "I could not commit.",
    "I will commit the fix once the hook passes.",            # a plan
    "Should I commit with --no-verify instead?",              # a question
    "I see the issue, stopping here.",                        # a stop notice
    "",                                                       # no answer at all
]


@pytest.mark.parametrize("answer", HONEST)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("attempts", [1, 3])
def test_honest_endings_stay_quiet_in_every_shape(shape, answer, attempts):
    make, failed, _ = SHAPES[shape]
    script = [step for n in range(attempts) for step in (calls(failed), calls(edit(n)))][:-1] + [says(answer)]
    result = run(script, [make(), edit_file])
    assert IGNORED_ERROR not in kinds(result), result.anomalies
    assert [e.tool for e in result.unresolved_errors] == [failed[0]]  # the failure is still a fact


def test_a_claim_about_a_command_that_later_succeeded_stays_quiet():
    outcomes = iter([(1, HOOK_FAILED), (0, "[main 1a2b3c4] fix parser")])
    tools = [shell(lambda command: next(outcomes)), edit_file]
    result = run([calls(bash("git commit -m fix")), calls(edit(1)), calls(bash("git commit -m 'fix parser'")),
                  says("Committed the fix.")], tools)
    assert result.anomalies == [] and result.unresolved_errors == []  # the later commit resolved the failed one


def test_a_failure_of_another_operation_is_not_what_the_claim_is_about():
    tools = [shell(failing(("grep", "")))]
    result = run([calls(bash("grep -rn total_price src/")), calls(bash("pytest -q")), says("All tests pass now.")],
                 tools)
    assert result.anomalies == []  # grep found nothing; the tests the answer speaks of passed
    assert [e.reported for e in result.unresolved_errors] == [None]


def test_looptrace_demo_ignored_error_shows_the_anomaly_without_a_judge(workdir, capsys, monkeypatch):
    monkeypatch.delenv("LOOPTRACE_JUDGE", raising=False)
    assert main(["demo", "ignored-error", "--trace-file", "t.jsonl"]) == 0
    out, err = capsys.readouterr()
    assert "flagged: ignored_error x1 (turn 4)" in out
    assert "ignored_error [warn]" in err and f"Why this fired: {CLAIMED_DONE}" in err


# --------------------------------------------------------------------------- 3. failures that come back


def _checked_commits(failures: list[str]) -> Callable[[str], tuple[int, str]]:
    """`git commit` fails with the next of `failures` (and succeeds when they run out); anything else succeeds."""
    left = iter(failures)

    def outcome(command: str) -> tuple[int, str]:
        if not command.startswith("git commit"):
            return 0, ""
        failure = next(left, None)
        return (0, "[main 1a2b3c4] fix") if failure is None else (1, failure)
    return outcome


def _black(n: int) -> str:
    """The same pre-commit check failing, its report different in every detail."""
    files = "\n".join(f"reformatted src/module_{n}_{i}.py" for i in range(n % 3 + 1))
    return (f"black....................................................................Failed\n- hook id: black\n"
            f"- duration: {0.17 * n:.2f}s\n- files were modified by this hook\n\n{files}\n\n"
            f"{n % 3 + 1} files reformatted, {10 + n} files left unchanged.")


FLAKE8 = ("flake8...................................................................Failed\n- hook id: flake8\n"
          "- exit code: 1\n\nsrc/parser.py:12:80: E501 line too long (93 > 79 characters)")


def test_a_failure_that_comes_back_after_a_different_one_counts_and_an_added_flag_is_the_same_call(spans):
    outcome = _checked_commits([_black(1), _black(2), FLAKE8, _black(3), _black(4), _black(5)])
    commit = bash("git commit -m 'fix parser'")
    script = []
    for n in range(5):
        script += [calls(commit), calls(edit(n))]
    script += [calls(bash("git commit -m 'fix parser' --no-verify")), says("The hook keeps failing; I stopped.")]
    result = run(script, [shell(outcome), edit_file], spans)
    (anomaly,) = result.anomalies
    assert anomaly.type == REPEATED_CALL
    # black failed at turns 1, 3, 7 and 9, flake8 at 5 between them, then the --no-verify retry at 11 failed as black
    # did: the streak fired at black's third failure (turn 7) and goes on to the retry, 4 failures the same way in
    # the last 10 turns (turn 1 has left the window by then)
    assert (anomaly.first_turn, anomaly.turn, anomaly.count) == (7, 11, 4)
    assert "failed the same way 4 times in the last 10 turns (turns 3, 7, 9, 11)" in anomaly.message


def test_the_same_with_a_commit_tool_and_its_no_verify_argument():
    attempts = itertools.count(1)

    @tool
    def git_commit(message: str, no_verify: bool = False) -> str:
        """Commit the staged changes."""
        n = next(attempts)
        raise ToolError(FLAKE8 if n == 3 else _black(n))

    script = []
    for n in range(5):
        script += [calls(COMMIT), calls(edit(n))]
    script += [calls(("git_commit", {"message": "fix parser", "no_verify": True})), says("Not committed: see above.")]
    result = run(script, [git_commit, edit_file])
    assert [(a.type, a.first_turn, a.count, a.turn) for a in result.anomalies] == [(REPEATED_CALL, 7, 4, 11)]


def test_edit_and_retest_with_genuinely_different_failures_then_a_pass_stays_quiet(spans):
    failures = iter([
        "FAILED tests/test_cart.py::test_total - AssertionError: assert 9 == 10\n1 failed in 0.21s",
        "FAILED tests/test_cart.py::test_total - TypeError: unsupported operand type(s)\n1 failed in 0.19s",
        "FAILED tests/test_cart.py::test_discount - AssertionError: assert 0 == 5\n1 failed in 0.25s",
    ])

    def outcome(command: str) -> tuple[int, str]:
        failure = next(failures, None) if command.startswith("pytest") else None
        return (1, failure) if failure else (0, "5 passed in 0.30s")

    script = []
    for n in range(3):
        script += [calls(bash("pytest -q")), calls(edit(n))]
    script += [calls(bash("pytest -q")), says("All tests pass now.")]
    result = run(script, [shell(outcome), edit_file], spans)
    assert result.anomalies == [] and result.unresolved_errors == []


# --------------------------------------------------------------------------- 4. a shell tool is many operations


def test_different_commands_failing_turn_after_turn_are_not_a_failing_tool(spans):
    outcome = failing(("grep", ""), ("python reproduce.py", "AssertionError: expected 10"),
                      ("pytest", TESTS_FAILED), ("ls", "ls: cannot access 'build': No such file or directory"),
                      ("git diff --exit-code", "diff --git a/src/parser.py b/src/parser.py"))
    script = [calls(bash(command)) for command in ("grep -rn total src/", "python reproduce.py", "pytest -q",
                                                   "ls build", "git diff --exit-code", "grep -rn subtotal src/")]
    result = run(script + [says("The total is computed in cart.py; the reproduction fails as reported.")],
                 [shell(outcome)], spans)
    assert FAILING_TOOL not in kinds(result)


def test_one_operation_failing_with_varying_arguments_is_a_failing_tool(spans):
    externally_managed = ("error: externally-managed-environment\n\n× This environment is externally managed\n"
                          "╰─> To install Python packages system-wide, try apt install python3-xyz")
    script = [calls(bash(f"pip install {package}")) for package in ("numpy<2", "setuptools<60", "cython", "-e .",
                                                                     "pytest==7.4")]
    result = run(script + [says("pip refuses to install anything here.")],
                 [shell(failing(("pip install", externally_managed)))], spans)
    (anomaly,) = [a for a in result.anomalies if a.type == FAILING_TOOL]
    assert (anomaly.tool, anomaly.turn, anomaly.count) == ("bash", 5, 5)
    assert "bash running `pip install` failed on every call for 5 turns" in anomaly.message


# --------------------------------------------------------------------------- 2. text loops that are loops


@tool
def read_config(section: str) -> str:
    """Read a section of the build configuration."""
    return f"[{section}]\nenabled = true"


def _answer_after_a_read(text: str, spans=None):
    return run([calls(("read_config", {"section": "cache"})), says(text)], [read_config], spans)


@pytest.mark.parametrize("text", [
    "Thinking... Done. " * 12,                                                         # a short chant
    "Let me look.\n```python\nprint(1)\n```" + " Thinking... Done." * 8,              # on a closing fence's line
    "I need to check the configuration file again. " * 300,                           # one sentence, hundreds of times
    "Checking.\n" * 40,                                                                # one line, back to back
])
def test_a_unit_repeated_back_to_back_is_repeated_text(text, spans):
    result = _answer_after_a_read(text, spans)
    (anomaly,) = result.anomalies
    assert (anomaly.type, anomaly.turn) == (REPEATED_TEXT, 2) and anomaly.count >= 5


def test_a_result_restated_after_each_case_of_an_analysis_is_not_a_loop():
    cases = "\n\n".join(f"Case {n}: the input has {n} items, so the loop runs {n} times and the guard holds.\n"
                        "Result: 0 errors." for n in range(1, 11))
    assert _answer_after_a_read(f"Let me go through each case.\n\n{cases}\n\nSo the function is correct.").anomalies \
        == []


def test_a_state_line_restated_while_tracing_code_is_not_a_loop():
    steps = ["We enter parse() with the raw string.", "The tokenizer splits it into three tokens.",
             "The first token is a number, so it is pushed.", "The second is an operator, so we reduce.",
             "The reducer returns early for a unary minus."]
    text = " ".join(f"{step} At this point total = 10." for step in steps)
    assert _answer_after_a_read(text).anomalies == []


def test_code_and_tables_that_repeat_are_still_not_text_loops():
    rows = "\n".join(["| cache | enabled |"] * 8)
    code = "```\n" + "retry()\n" * 8 + "```"
    assert _answer_after_a_read(f"The settings:\n{rows}\n\nThe loop:\n{code}\nThat is all.").anomalies == []
