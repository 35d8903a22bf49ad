"""A tool error the run dealt with (the model said so and booked another unit: no ignored_error) is a fact said in
one quiet line, not a warning, and not called unresolved: the happy demo ends "1 tool error, reported in the answer",
without a ⚠. "Left unresolved" is for what nobody addressed."""

from __future__ import annotations

from looptrace.cli import main


def test_the_happy_demo_and_its_trace_end_without_a_warning(workdir, capsys):
    assert main(["demo", "--trace-file", "t.jsonl"]) == 0
    out, err = capsys.readouterr()
    said = (out + err).splitlines()
    assert "1 tool error, reported in the answer: reserve_equipment(2026-10-08, EQ-001)" in "\n".join(said)
    assert not [line for line in said if "⚠" in line or "left unresolved" in line], said

    assert main(["traces", "show", "--file", "t.jsonl"]) == 0  # read back from the root span's record
    shown = capsys.readouterr().out.splitlines()
    assert [line for line in shown if line.startswith("1 tool error, reported in the answer: reserve_equipment")]
    assert not [line for line in shown if "⚠" in line or "left unresolved" in line]

    assert main(["detect", "t.jsonl"]) == 0  # rebuilt from the spans: the same reading of the answer
    out, err = capsys.readouterr()
    assert [line for line in out.splitlines()
            if line.startswith("  1 tool error, reported in the answer: reserve_equipment(2026-10-08, EQ-001)")], out
    assert err.rstrip().endswith("0 anomalies found in t.jsonl; 1 tool error reported by the model"), err


def test_an_error_the_final_answer_ignored_is_still_a_warning():
    import io

    from looptrace import Agent, ScriptedModel, tool
    from looptrace.cli.views import LiveView
    from looptrace.testing import final_answer, tool_use

    @tool
    def reserve_equipment(item_id: str) -> str:
        """Reserve one item."""
        raise RuntimeError(f"{item_id} has no stock left")

    @tool
    def notify(text: str) -> str:
        """Tell the team."""
        return "sent"

    out = io.StringIO()
    script = [tool_use("reserve_equipment", {"item_id": "EQ-001"}), tool_use("reserve_equipment", {"item_id": "EQ-001"}),
              tool_use("notify", {"text": "booked"}), final_answer("All done: your equipment is reserved.")]
    result = Agent("claude-sonnet-5-5", tools=[reserve_equipment, notify], client=ScriptedModel(script),
                   on_event=LiveView(out)).run("Reserve EQ-001")
    assert [a.type for a in result.anomalies] == ["ignored_error"], result.anomalies
    assert [line for line in out.getvalue().splitlines() if line.startswith("⚠ 1 tool error left unresolved")]
