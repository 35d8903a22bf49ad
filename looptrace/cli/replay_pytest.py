"""`looptrace replay --pytest FILE`: a stored run written out as a self-contained regression test.

The file holds the run's task, system prompt, tool definitions, recorded model responses and tool results as Python
literals, and one test that replays them through an Agent built with looptrace's pytest plugin (``scripted_agent``).
The test fails while the loop detector finds a repeated call or a cycle in the run, and passes once the agent's fix
stops the loop: a tool that now makes progress (point ``agent_tools`` at the real tools), a limit that ends the run
before it goes round (``LIMITS``, with the status it ends on accepted in ``ACCEPTED_ENDINGS``).

The test needs nothing but looptrace and pytest: not the trace file, not the network.
"""

from __future__ import annotations

import os
import pprint
from pathlib import Path
from typing import Any

from looptrace.replay import RecordedModelError, RecordedModelFailure, RecordedRun, findings

# The runs whose recording has a natural end: the model stopped by itself, and the test can run it to that end.
_NATURAL_ENDINGS = {"done": "DONE", "max_tokens": "MAX_TOKENS", "stop_sequence": "STOP_SEQUENCE",
                    "refusal": "REFUSAL", "context_window": "CONTEXT_WINDOW"}
_BUDGET_ENDINGS = {"max_turns": "MAX_TURNS", "token_budget": "TOKEN_BUDGET", "cost_budget": "COST_BUDGET"}


def write_regression_test(path: Path, recorded: RecordedRun, *, tools_file: Path | None = None) -> None:
    """Write the regression test of ``recorded`` to ``path``; with ``tools_file`` its calls go to those tools."""
    path.write_text(regression_test_source(recorded, tools_file=tools_file, test_dir=path.parent), encoding="utf-8")


def regression_test_source(recorded: RecordedRun, *, tools_file: Path | None = None,
                           test_dir: Path | None = None) -> str:
    """The source of the regression test of ``recorded`` (see the module's docstring)."""
    responses: list[Any] = [RecordedModelFailure(r.error) if isinstance(r, RecordedModelError) else r
                            for r in recorded.responses]
    if responses and isinstance(responses[-1], RecordedModelFailure):
        responses.pop()  # the call that failed ended the run: the test stops before it
    limits, endings, why = _ending(recorded, len(responses))
    results = [{"call_id": c.call_id, "tool": c.tool, "arguments": c.arguments, "result": c.result,
                "is_error": c.is_error} for c in recorded.calls]
    found = ", ".join(str(f) for f in findings(recorded.anomalies)) or "no anomaly"
    imports = ["LOOP_TYPES", "recorded_tools"]
    if any(isinstance(r, RecordedModelFailure) for r in responses):
        imports.append("RecordedModelFailure")
    if tools_file is not None:
        imports.append("tools_from_file")
    parts = [
        _docstring(recorded, found),
        "from __future__ import annotations\n\n"
        + ("from pathlib import Path\n\n" if tools_file is not None else "")
        + "from looptrace import DetectorConfig, Limits, RunStatus\n"
        + f"from looptrace.replay import {', '.join(sorted(imports))}\n",
        "# --- the recorded run " + "-" * 94,
        f"MODEL = {recorded.model!r}",
        f"AGENT = {recorded.agent!r}",
        f"SYSTEM = {_literal(recorded.system)}",
        f"TASK = {_literal(recorded.task)}",
        f"TOOL_DEFINITIONS = {_literal(recorded.tool_definitions)}",
        f"RESPONSES = {_literal(responses)}",
        f"RECORDED_RESULTS = {_literal(results)}",
        "",
        "# --- the agent under test: change these to check a fix " + "-" * 61,
        "",
        "",
        _tools_function(tools_file, test_dir),
        "",
        f"# {why}",
        f"LIMITS = {limits}",
        "DETECTOR = DetectorConfig()",
        'ON_ANOMALY = "warn"  # report every loop and steer none: the test sees the whole recorded run',
        f"ACCEPTED_ENDINGS = {{{', '.join(f'RunStatus.{e}' for e in endings)}}}",
        "",
        "",
        _test_function(recorded),
    ]
    return "\n".join(parts)


def _docstring(recorded: RecordedRun, found: str) -> str:
    return f'''"""A regression test of run {recorded.trace_id} (agent {recorded.agent!r}, {recorded.model or "?"}).

Written by `looptrace replay --pytest`. The run took {recorded.turns} turns and ended {recorded.status or "?"}; its live
detector reported: {found}.

The test replays the run's recorded model responses (a scripted model: the same responses whatever the agent sends
back) through the agent below, and fails while the loop detector still finds a repeated call or a cycle in it. It
passes once the agent's fix stops the loop:

- a tool that now makes progress: make ``agent_tools`` return your real tools (called with the recorded arguments,
  secrets as the trace holds them: redacted);
- a limit that ends the run before it goes round: change ``LIMITS``, and accept the status it then ends with in
  ``ACCEPTED_ENDINGS``;
- the detector's thresholds: ``DETECTOR``.

A prompt cannot change recorded responses: after a prompt fix, record a new run and write its test again
(``looptrace replay --trace-id <new run> --pytest <file>``), which passes when the new run does not loop.
"""
'''


def _ending(recorded: RecordedRun, responses: int) -> tuple[str, list[str], str]:
    """The test's limits, the endings it accepts, and why, from the way the recorded run ended."""
    status = recorded.status or ""
    if status in _NATURAL_ENDINGS:
        return ("Limits(max_turns=None, tool_timeout_s=None)", [_NATURAL_ENDINGS[status]],
                f"the recorded run ended {status} by itself")
    if status == "max_turns":
        return (f"Limits(max_turns={recorded.turns}, tool_timeout_s=None)", ["DONE", "MAX_TURNS"],
                "the recorded run's turn limit")
    if status == "token_budget" and recorded.total_tokens:
        return (f"Limits(max_turns=None, max_total_tokens={recorded.total_tokens}, tool_timeout_s=None)",
                ["DONE", "TOKEN_BUDGET"], "the recorded run's token budget")
    if status == "cost_budget" and recorded.cost_usd:
        return (f"Limits(max_turns=None, max_cost_usd={recorded.cost_usd!r}, tool_timeout_s=None)",
                ["COST_BUDGET", "DONE"], "the recorded run's cost budget")
    return (f"Limits(max_turns={responses}, tool_timeout_s=None)", ["DONE", "MAX_TURNS"],
            f"the recording ends at turn {responses}, where the live run ended {status or 'unrecorded'}")


def _tools_function(tools_file: Path | None, test_dir: Path | None) -> str:
    recorded = "recorded_tools(TOOL_DEFINITIONS, RECORDED_RESULTS)"
    if tools_file is None:
        return (f'def agent_tools():\n'
                f'    """The tools the run\'s calls go to: these answer with the recorded results, in order. Return '
                f'your\n    real tools instead to check a fix of a tool."""\n'
                f'    return {recorded}\n')
    return (f'TOOLS_FILE = {_path_literal(tools_file, test_dir)}\n\n\n'
            f'def agent_tools():\n'
            f'    """Your tools, from TOOLS_FILE: the run\'s calls go to them with the recorded arguments. Return\n'
            f'    {recorded} to answer with what they returned when the run was\n    recorded."""\n'
            f'    return tools_from_file(TOOLS_FILE)\n')


def _test_function(recorded: RecordedRun) -> str:
    name = f"test_run_{recorded.trace_id[:12]}_does_not_loop"
    return f'''def {name}(scripted_agent):
    agent = scripted_agent(RESPONSES, model=MODEL, name=AGENT, system=SYSTEM, tools=agent_tools(), limits=LIMITS,
                           detector=DETECTOR, on_anomaly=ON_ANOMALY)
    result = agent.run(TASK)
    loops = [f"{{a.type}} from turn {{a.first_turn or a.turn}}: {{a.message}}" for a in result.anomalies
             if a.type in LOOP_TYPES]
    assert not loops, "the run still loops: " + "; ".join(loops)
    assert result.status in ACCEPTED_ENDINGS, (
        f"the run ended {{result.status.value}} after {{result.turns}} turns: {{result.error or result.final_text!r}}")
'''


def _literal(value: Any) -> str:
    """A Python literal of a JSON-like value (and the recorded failures), laid out to be read."""
    text = pprint.pformat(value, width=116, sort_dicts=False)
    return text if "\n" not in text else "(\n    " + text.replace("\n", "\n    ") + "\n)"


def _path_literal(path: Path, test_dir: Path | None) -> str:
    """The tools file as the test should find it: beside the test when it is (so the two can move together)."""
    resolved = path.resolve()
    if test_dir is not None:
        try:
            relative = Path(os.path.relpath(resolved, test_dir.resolve()))
        except ValueError:  # another drive (Windows)
            relative = None
        if relative is not None and relative.parts[:1] != ("..",):
            return f"Path(__file__).parent / {relative.as_posix()!r}"
    return f"Path({str(resolved)!r})"
