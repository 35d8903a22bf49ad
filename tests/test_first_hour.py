"""What a newcomer hits in the first hour on a fresh clone (issue 43): help texts that say what each command does and
how it exits, listings that line up, empty and missing inputs said plainly, settings checked evenly."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from looptrace.cli import main
from looptrace.cli.app import build_parser
from looptrace.runtime.result import RunStatus


def help_of(*path: str) -> str:
    parser = build_parser()
    for name in path:
        parser = next(a for a in parser._actions if a.dest in ("command", "traces_command", "mcp_command")).choices[name]
    return " ".join(parser.format_help().split())


# --- help ------------------------------------------------------------------------------------------------------------


def test_traces_push_help_says_what_it_does():
    text = help_of("traces", "push")
    usage_ends = text.index("options:")
    description = text[text.index("[--resend-interrupted]") + len("[--resend-interrupted]"):usage_ends].strip()
    assert description.startswith("Send again what a backend"), description
    assert "undelivered list" in description


def test_the_top_level_help_says_traces_also_pushes():
    text = help_of()
    traces = text[text.index(" traces "):text.index(" replay ")]
    assert "show" in traces and "list" in traces and "push" in traces, traces


# --- traces list ------------------------------------------------------------------------------------------------------


def root_line(number: int, status: str, name: str = "invoke_agent shop") -> str:
    span = {"traceId": f"{number:032x}", "spanId": f"{number:016x}", "name": name,
            "startTimeUnixNano": "1767225600000000000", "endTimeUnixNano": "1767225601000000000",
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
                           {"key": "looptrace.run.status", "value": {"stringValue": status}},
                           {"key": "looptrace.run.turns", "value": {"intValue": "3"}}]}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"scope": {"name": "s"}, "spans": [span]}]}]}) + "\n"


def test_traces_list_columns_line_up_whatever_status_each_run_ended_with(tmp_path, capsys):
    statuses = [status.value for status in RunStatus]
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(root_line(n, status) for n, status in enumerate(statuses, start=1)))
    assert main(["traces", "list", "--file", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[5] for line in lines] == statuses  # id, date, time, "invoke_agent shop", status
    assert len({line.index("3 turns") for line in lines}) == 1, "\n".join(lines)


# --- reading trace files: missing, empty, an empty id -------------------------------------------------------------------

READERS = [["traces", "show"], ["traces", "list"], ["detect"], ["replay"]]


@pytest.mark.parametrize("command", READERS, ids=" ".join)
def test_a_missing_trace_file_says_how_to_make_one(workdir, capsys, command):
    assert main(command) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "cannot read trace file .looptrace/traces.jsonl: No such file or directory" in err
    assert "`looptrace demo` writes one" in err


@pytest.mark.parametrize("command", READERS, ids=" ".join)
def test_an_empty_trace_file_is_the_same_usage_error_for_every_reader(workdir, capsys, command):
    (workdir / "empty.jsonl").write_text("")
    file = ["empty.jsonl"] if command == ["detect"] else ["--file", "empty.jsonl"]
    assert main([*command, *file]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("looptrace: error: empty.jsonl holds no OTLP/JSON spans (it is empty); is it a trace "
                           "file?"), err


@pytest.mark.parametrize("command", [["traces", "show"], ["replay"]], ids=" ".join)
@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_trace_id_is_refused_not_taken_for_the_latest_run(workdir, capsys, command, empty):
    assert main(["demo", "--json"]) == 0
    capsys.readouterr()
    assert main([*command, "--trace-id", empty]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("looptrace: error: --trace-id is empty: give a trace id or its first digits")


# --- settings, checked evenly ------------------------------------------------------------------------------------------


def settings_warning(capsys, monkeypatch, variable: str, value: str) -> str:
    monkeypatch.setenv(variable, value)
    assert main(["demo", "--json"]) == 0
    return capsys.readouterr().err


@pytest.mark.parametrize("variable", ["LOOPTRACE_TRACE_FILE_MAX_BYTES", "LOOPTRACE_MAX_LINE_BYTES"])
def test_a_negative_size_is_called_negative(workdir, capsys, monkeypatch, variable):
    err = settings_warning(capsys, monkeypatch, variable, "-5")
    assert f"{variable} is negative; the default (67,108,864 bytes) is used" in err


@pytest.mark.parametrize("variable", ["LOOPTRACE_TRACE_FILE_MAX_BYTES", "LOOPTRACE_MAX_LINE_BYTES"])
def test_a_mistyped_size_is_said_with_how_to_write_one(workdir, capsys, monkeypatch, variable):
    err = settings_warning(capsys, monkeypatch, variable, "64 megabytes")
    assert f"{variable} is not a size (write bytes, or a number with KiB, MiB or GiB" in err


@pytest.mark.parametrize("value, size", [("1048576", 2**20), ("64MiB", 64 * 2**20), ("64MB", 64 * 10**6),
                                         ("1.5 GiB", 3 * 2**29), ("0", 0)])
def test_a_size_takes_the_units_people_write(value, size):
    from looptrace.instrumentation.settings import Settings

    settings = Settings.from_env({"LOOPTRACE_TRACE_FILE_MAX_BYTES": value})
    assert (settings.trace_file_max_bytes, settings.ignored) == (size, ())


def test_a_line_limit_below_its_floor_is_said(workdir, capsys, monkeypatch):
    err = settings_warning(capsys, monkeypatch, "LOOPTRACE_MAX_LINE_BYTES", "10")
    assert "LOOPTRACE_MAX_LINE_BYTES is below its floor; 1,024 bytes is used" in err


@pytest.mark.parametrize("variable", ["LANGFUSE_BASE_URL", "LANGFUSE_HOST"])
@pytest.mark.parametrize("value", ["not-a-url", "cloud.langfuse.com", "ftp://cloud.langfuse.com", "https://",
                                   "sk-lf-123-pasted-into-the-wrong-variable"])
def test_a_langfuse_url_that_is_no_url_is_refused_up_front(workdir, capsys, monkeypatch, variable, value):
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk-lf-1")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-1")
    monkeypatch.delenv("LANGFUSE_BASE_URL", raising=False)
    monkeypatch.setenv(variable, value)
    assert main(["demo"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"looptrace: error: {variable} is not a URL")
    assert "write it as https://cloud.langfuse.com" in err and len(err.strip().splitlines()) == 1
    assert "sk-lf-123" not in err  # the value is never repeated: it may be a secret set by mistake
    assert not (workdir / ".looptrace").exists()  # refused before anything ran


@pytest.mark.parametrize("value", ["not-a-url", "localhost:8080", "https://"])
def test_an_anthropic_base_url_that_is_no_url_is_refused_before_the_run(workdir, capsys, monkeypatch, value):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", value)
    assert main(["run", "hello"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("looptrace: error: ANTHROPIC_BASE_URL is not a URL")
    assert "https://api.anthropic.com" in err and len(err.strip().splitlines()) == 1
    assert not (workdir / ".looptrace").exists()


# --- trying run, resume and approvals without a key -------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_TOOLS = str(ROOT / "looptrace" / "examples" / "tools.py")


@pytest.fixture
def no_key(monkeypatch):
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def paused_state(err: str) -> str:
    return re.search(r"looptrace resume (\S+) --approve", err).group(1)


def test_run_pauses_and_resumes_offline_with_the_example_tools(workdir, capsys, no_key):
    task = ["run", "Reserve a projector for 2026-10-08", "--tools", EXAMPLE_TOOLS, "--model", "scripted:equipment"]
    assert main(task) == 40  # reserve_equipment needs approval; stdin is no terminal here, so the run pauses
    first = capsys.readouterr().err
    assert "reserve_equipment" in first and "toolu_02" in first
    assert main(["resume", paused_state(first), "--approve", "toolu_02"]) == 40  # EQ-001 has none: on to EQ-002
    second = capsys.readouterr().err
    assert "EQ-001 has no stock left" in second and "toolu_03" in second
    assert main(["resume", paused_state(second), "--approve", "toolu_03"]) == 0
    out = capsys.readouterr().out
    assert "I reserved Projector B (EQ-002) for 2026-10-08" in out


def test_run_with_every_call_approved_ends_in_one_go_offline(workdir, capsys, no_key):
    assert main(["run", "Reserve a projector", "--tools", EXAMPLE_TOOLS, "--model", "scripted:equipment",
                 "--approve-all", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["status"], result["turns"], result["cost_usd"]) == ("done", 4, None)  # no price: no cost


@pytest.mark.slow
def test_run_with_the_example_mcp_server_works_offline(workdir, capsys, no_key):
    assert main(["run", "Note that I need eggs", "--mcp", f"{sys.executable} -m looptrace.example_mcp_server",
                 "--model", "scripted:notes"]) == 0
    out, err = capsys.readouterr()
    assert "saved a note 'groceries'" in out
    assert "add_note(" in err and "search_notes(" in err and "groceries: eggs, milk" in err


def test_a_script_file_of_your_own_replays_its_responses(workdir, capsys, no_key):
    (workdir / "script.json").write_text(json.dumps([{"content": [{"type": "text", "text": "Hello from a file."}]}]))
    assert main(["run", "Say hello", "--model", "scripted:script.json"]) == 0
    assert capsys.readouterr().out == "Hello from a file.\n"


@pytest.mark.parametrize("model, says", [
    ("scripted:weather", "no such script; give one of equipment, notes or a FILE.json"),
    ("scripted:absent.json", "cannot read absent.json: No such file or directory"),
    ("scripted:bad.json", "bad.json is not JSON"),
    ("scripted:object.json", "must hold a JSON array of responses"),
])
def test_a_script_that_cannot_be_used_is_one_line_and_exit_2(workdir, capsys, no_key, model, says):
    (workdir / "bad.json").write_text("[{")
    (workdir / "object.json").write_text('{"content": "hi"}')
    assert main(["run", "hello", "--model", model]) == 2
    out, err = capsys.readouterr()
    assert out == "" and says in err and len(err.strip().splitlines()) == 1, err


def test_without_a_key_the_error_points_at_the_offline_model(workdir, capsys, no_key):
    assert main(["run", "hello"]) == 2
    assert "--model scripted:equipment" in capsys.readouterr().err


def test_every_tools_file_the_docs_pass_to_looptrace_exists():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = {match for page in pages for match in re.findall(r"--tools (\S+\.py)", page.read_text())}
    named -= {"FILE.py"}  # the placeholder of the usage lines
    assert named and all((ROOT / name).is_file() for name in named), named


# --- --approve names a tool of the run -------------------------------------------------------------------------------


def test_approving_a_tool_the_run_does_not_have_is_a_usage_error(workdir, capsys, no_key):
    assert main(["run", "hi", "--tools", EXAMPLE_TOOLS, "--model", "scripted:equipment",
                 "--approve", "reserve_equipmnet"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == ("looptrace: error: --approve reserve_equipmnet: the run has no tool of that "
                                         "name (its tools: reserve_equipment, search_equipment)")
    assert not (workdir / ".looptrace").exists()  # refused before anything ran
    assert main(["run", "hi", "--model", "scripted:equipment", "--approve", "pay"]) == 2
    assert "it offers no tools (no --tools FILE.py)" in capsys.readouterr().err


# --- the README and detect's help say what is so -----------------------------------------------------------------------

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_cli_list_names_every_command():
    block = README.split("## The CLI", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    listed = {line.split()[1] for line in block.splitlines() if line.startswith("looptrace ")}
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert listed == set(commands), set(commands) ^ listed
    assert "looptrace mcp list" in block and "looptrace resume STATE" in block


def test_the_readme_names_one_model_and_the_price_table_where_it_is():
    assert set(re.findall(r"claude-[a-z]+-\d+-\d+", README)) == {"claude-sonnet-5-5"}
    table = re.search(r"the price table is\s+`([^`]+)`", README).group(1)
    assert "DEFAULT_PRICES" in (ROOT / table).read_text()


def test_the_readme_says_its_detector_figures_need_a_corpus_outside_the_repository():
    paragraph = README[README.index("recorded runs of real agents"):][:400]
    assert "outside this repository" in paragraph
    assert "docs/detector.md#measured-on-real-agents" in paragraph


def test_detect_json_prints_the_runs_its_help_says_it_prints(workdir, capsys):
    assert main(["demo", "--json"]) == 0  # a run with no anomaly and one tool error left unresolved
    capsys.readouterr()
    assert main(["detect", "--json"]) == 0
    (verdict,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert verdict["anomalies"] == [] and len(verdict["unresolved_errors"]) == 1
    text = help_of("detect")
    assert "for each run shown: those with anomalies or with tool errors left unresolved" in text
