"""`looptrace report`: one HTML page of the runs in a trace file, where they looped and what it cost.

What a user relies on: the page's figures are `detect --json`'s; a looping run is drawn with its loop over the turns
it took; content is shown only where the file holds it; recorded text never becomes markup; the page fetches
nothing; --since, --max-runs and bad input behave as the help says. (tests/test_report_browser.py opens the page in
a real browser.)
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from report_pages import elements, figures_of_detect, figures_of_page, looping_tools_only

from looptrace import Agent, ScriptedModel, approve, reject, tool
from looptrace.cli import main, trace_reading
from looptrace.instrumentation.tracefile import TraceFileProcessor

DEMOS = ("equipment", "runaway", "ignored-error")
# What the demos' spans hold when content is captured: the task, arguments, results, the model's words, errors.
DEMO_CONTENT = ("Reserve a projector for 2026-10-08", '"keyword": "projector"', "Projector B", "no stock left",
                "You book office equipment", "booked for the whole day", "full_day", "EQ-002", "projector")


def demos(path: Path, *names: str) -> Path:
    for name in names or DEMOS:
        assert main(["demo", name, "--trace-file", str(path)]) in (0, 30)
    return path


def earlier(lines: bytes, by_ns: int) -> bytes:
    """Trace file lines whose spans and events happened ``by_ns`` earlier."""
    return re.sub(rb'"(startTimeUnixNano|endTimeUnixNano|timeUnixNano)":"(\d+)"',
                  lambda m: b'"%s":"%d"' % (m.group(1), int(m.group(2)) - by_ns), lines)


def report(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["report", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def page_of(capsys, trace_file: Path, *flags: str) -> str:
    output = trace_file.with_suffix(".html")
    code, out, err = report(capsys, "--trace-file", str(trace_file), "--output", str(output), *flags)
    assert code == 0, err
    assert out.strip() == str(output)
    return output.read_text(encoding="utf-8")


def detect_json(capsys, trace_file: Path) -> str:
    capsys.readouterr()
    main(["detect", "--json", "--all", str(trace_file)])
    return capsys.readouterr().out


def test_the_overview_says_what_detect_json_says(workdir, capsys):
    trace_file = demos(workdir / "t.jsonl", *DEMOS, "runaway", "equipment")
    page = figures_of_page(page_of(capsys, trace_file))
    expected = figures_of_detect(detect_json(capsys, trace_file))
    assert page["runs"] == expected["runs"] == 5
    assert page["looped"] == expected["looped"] == 3  # the two runaways, and the answer that ignored an error
    for figure in ("anomalies", "loop_tokens", "loop_usd", "unresolved", "statuses", "agents", "top_loops"):
        assert page[figure] == expected[figure], figure
    assert looping_tools_only(page) == expected["tools"]
    assert set(page["tools"]) == {"search_equipment", "reserve_equipment"}  # every tool called is listed


def test_a_looping_run_is_drawn_with_its_loop_over_the_turns_it_took(workdir, capsys):
    html = page_of(capsys, demos(workdir / "t.jsonl", "runaway"))
    found = elements(html)
    (section,) = [e for e in found if e["tag"] == "section" and "run" in e["attrs"].get("class", "").split()]
    assert section["attrs"]["data-turns"] == "4"
    (band,) = [e for e in found if e["tag"] == "g" and e["attrs"].get("class") == "loop"]
    assert (band["attrs"]["data-type"], band["attrs"]["data-tool"]) == ("repeated_call", "search_equipment")
    assert (band["attrs"]["data-first-turn"], band["attrs"]["data-last-turn"]) == ("1", "4")
    # The band covers turns 1 to 4 on the time axis, where their bars are.
    (area,) = [e for e in found if e["tag"] == "rect" and e["attrs"].get("class") == "loop-band"]
    turns = {int(e["attrs"]["data-turn"]): e for e in found if e["tag"] == "rect"
             and e["attrs"].get("class", "").startswith("turn")}
    left, right = float(area["attrs"]["x"]), float(area["attrs"]["x"]) + float(area["attrs"]["width"])
    assert sorted(turns) == [1, 2, 3, 4]
    assert abs(left - float(turns[1]["attrs"]["x"])) < 0.2
    assert abs(right - float(turns[4]["attrs"]["x"]) - float(turns[4]["attrs"]["width"])) < 0.2
    assert "repeated_call search_equipment ×4, turns 1–4: 4 turns, 2,320 tokens, $0.0056" in band["text"]
    fired = [e["attrs"]["data-turn"] for e in found if e["tag"] == "li" and e["attrs"].get("class") == "fired"]
    assert fired == ["3", "4"]  # it fired at turn 3 (nudge) and turn 4 (stop)


def test_errors_are_marked_where_they_happened(workdir, capsys):
    html = page_of(capsys, demos(workdir / "t.jsonl", "equipment"))
    found = elements(html)
    failed = [e for e in found if e["tag"] == "rect" and e["attrs"].get("class") == "tool error"]
    assert [(e["attrs"]["data-turn"], e["attrs"]["data-tool"]) for e in failed] == [("2", "reserve_equipment")]
    assert "RuntimeError" in failed[0]["text"]
    assert "1 tool error left unresolved when the run ended" in html
    assert "<li>reserve_equipment(2026-10-08, EQ-001) at turn 2: &#39;RuntimeError: EQ-001 has no stock" in html


@pytest.mark.parametrize("variable, value", [("LOOPTRACE_CAPTURE_CONTENT", "false"),
                                             ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "NO_CONTENT")])
def test_a_file_recorded_without_content_shows_none_anywhere_in_the_page(workdir, capsys, monkeypatch, variable,
                                                                          value):
    with_content = unescape(page_of(capsys, demos(workdir / "on.jsonl")))
    assert [text for text in DEMO_CONTENT if text not in with_content] == []  # the control: with content, shown
    monkeypatch.setenv(variable, value)
    html = page_of(capsys, demos(workdir / "off.jsonl"))
    assert [text for text in DEMO_CONTENT if text in unescape(html).lower() or text in html] == []
    assert '<details class="content"' not in html and "<blockquote" not in html
    assert html.count("recorded without content") == 3
    assert figures_of_page(html)["looped"] == 1  # the loop is still found and drawn, from the digests
    assert 'data-first-turn="1" data-last-turn="4"' in html


def test_recorded_text_is_shown_as_text_never_as_markup(workdir, capsys):
    hostile = '</pre><script>alert(1)</script><img src="https://example.com/x.png"><a href="http://x">'

    @tool
    def fetch(url: str) -> str:
        """Fetch a page."""
        return hostile

    trace_file = workdir / "t.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(TraceFileProcessor(trace_file))
    agent = Agent("claude-sonnet-4-5", tools=[fetch], tracer_provider=provider, client=ScriptedModel([
        {"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "t1", "name": "fetch",
                                                  "input": {"url": hostile}}]},
        {"stop_reason": "end_turn", "content": [{"type": "text", "text": hostile}]}]))
    agent.run(f"Read {hostile}")
    provider.shutdown()
    html = page_of(capsys, trace_file)
    assert html.count("<script") == 1  # the page's own
    assert "<img" not in html and 'href="http' not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_the_page_asks_for_nothing_from_anywhere(workdir, capsys):
    html = page_of(capsys, demos(workdir / "t.jsonl"))
    found = elements(html)
    links = [e["attrs"]["href"] for e in found if "href" in e["attrs"]]
    assert links and all(link.startswith("#") for link in links)
    assert not [e for e in found if "src" in e["attrs"] or e["tag"] in ("link", "iframe", "object", "embed", "img")]
    assert "url(" not in html and "@import" not in html and "http://" not in html.replace("http://www.w3.org", "")
    (policy,) = [e["attrs"]["content"] for e in found if e["attrs"].get("http-equiv") == "Content-Security-Policy"]
    assert policy.startswith("default-src 'none'; script-src 'sha256-")


def test_since_leaves_the_older_runs_out_and_says_so(workdir, capsys):
    recent = demos(workdir / "recent.jsonl", "runaway")
    old = demos(workdir / "old.jsonl", "equipment").read_bytes()
    trace_file = workdir / "t.jsonl"
    trace_file.write_bytes(earlier(old, 3 * 86_400 * 10**9) + recent.read_bytes())
    whole = page_of(capsys, trace_file)
    assert figures_of_page(whole)["runs"] == 2
    # runs over days are drawn by the day, the empty days between them too (runs within two days: by the hour)
    (chart,) = [e for e in elements(whole) if e["attrs"].get("aria-label") == "runs by status"]
    days = [e["text"] for e in elements(whole) if e["attrs"].get("class") == "label"
            and any(p["attrs"] == chart["attrs"] for p in e["parents"])]
    assert "<small>per day</small>" in whole and len(days) == 4
    html = page_of(capsys, trace_file, "--since", "1d")
    assert "<small>per hour</small>" in html
    assert figures_of_page(html)["runs"] == 1 and figures_of_page(html)["looped"] == 1
    assert "1 run that started before --since left out" in html
    assert "runs started since" in html


def test_a_bound_on_runs_drawn_in_full_keeps_the_looping_runs_and_says_so(workdir, capsys):
    trace_file = demos(workdir / "t.jsonl", "equipment", "runaway", "equipment")
    html = page_of(capsys, trace_file, "--max-runs", "1")
    found = elements(html)
    drawn = [e for e in found if e["tag"] == "section" and "run" in e["attrs"].get("class", "").split()]
    assert len(drawn) == 1 and drawn[0]["attrs"]["data-trace-id"] in [
        e["attrs"]["data-trace-id"] for e in found if e["tag"] == "tr" and e["attrs"].get("data-type")]
    assert figures_of_page(html)["runs"] == 3  # every run is counted all the same
    assert "2 more runs are counted above but not drawn: a report draws at most 1 runs in full" in html


def test_a_run_inside_another_runs_tool_is_a_run_of_its_own(workdir, capsys):
    from test_nested_runs import run_lead_with_a_sub_agent

    trace_file = workdir / "t.jsonl"
    run_lead_with_a_sub_agent(trace_file)
    html = page_of(capsys, trace_file)
    assert figures_of_page(html)["runs"] == 2
    assert figures_of_page(html)["agents"] == figures_of_detect(detect_json(capsys, trace_file))["agents"]
    sections = {e["attrs"]["data-trace-id"]: e for e in elements(html)
                if e["tag"] == "section" and "data-turns" in e["attrs"]}
    assert len(re.findall(r'<section class="run"', html)) == 2 and len(sections) == 1  # one trace, two runs
    turns = sorted(int(e["attrs"]["data-turns"]) for e in elements(html) if e["tag"] == "section"
                   and "data-turns" in e["attrs"])
    assert turns == [2, 4]


def test_approvals_are_marked_on_the_timeline(workdir, capsys):
    @tool(needs_approval=True)
    def pay(to: str, amount: int) -> str:
        """Send money."""
        return f"paid {amount} to {to}"

    trace_file = workdir / "t.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(TraceFileProcessor(trace_file))
    for decision in (approve(), reject("paid on Monday")):
        agent = Agent("claude-sonnet-4-5", tools=[pay], tracer_provider=provider, approver=lambda _, d=decision: d,
                      client=ScriptedModel([{"stop_reason": "tool_use", "content": [
                          {"type": "tool_use", "id": "t1", "name": "pay", "input": {"to": "Ann", "amount": 500}}]},
                          {"stop_reason": "end_turn", "content": [{"type": "text", "text": "Done."}]}]))
        agent.run("Pay Ann 500")
    provider.shutdown()
    html = page_of(capsys, trace_file)
    marks = sorted(e["attrs"]["class"] for e in elements(html) if e["tag"] == "path"
                   and "approval" in e["attrs"].get("class", ""))
    assert marks == ["approval approved", "approval rejected"]
    assert "◆ rejected by approver" in html and "paid on Monday" in html  # the reason: content, captured here


def test_progress_shows_at_a_terminal_for_a_big_file(workdir, capsys, monkeypatch):
    trace_file = demos(workdir / "t.jsonl", "equipment")
    monkeypatch.setattr(trace_reading, "PROGRESS_MIN_BYTES", 1)  # "big": anything, for the test

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["report", "--trace-file", str(trace_file), "--output", "r.html"]) == 0
    assert "reading t.jsonl:" in terminal.getvalue()
    assert "1 run (0 looped, 1 drawn in full)" in terminal.getvalue()


def test_rotated_files_are_read_with_the_file(workdir, capsys):
    trace_file = demos(workdir / "t.jsonl", "runaway")
    trace_file.rename(workdir / "t.jsonl.1")
    demos(trace_file, "equipment")
    html = page_of(capsys, trace_file)
    assert figures_of_page(html)["runs"] == 2 and "(and 1 file it was rotated into)" in html


@pytest.mark.parametrize("setup, argv, said", [
    (lambda d: (d / "log.txt").write_text("hello\nworld\n"), ["--trace-file", "log.txt"], "holds no OTLP/JSON spans"),
    (lambda d: None, ["--trace-file", "missing.jsonl"], "cannot read trace file missing.jsonl"),
    (lambda d: demos(d / "t.jsonl", "equipment"), ["--trace-file", "t.jsonl", "--output", "no/such/r.html"],
     "cannot write no/such/r.html: no folder no/such"),
    (lambda d: demos(d / "t.jsonl", "equipment"), ["--trace-file", "t.jsonl", "--output", "."], "is a directory"),
    (lambda d: None, ["--max-runs", "0"], "expected a whole number of at least 1"),
    (lambda d: None, ["--since", "last tuesday"], "expected an ISO time"),
])
def test_bad_input_is_a_usage_error_that_writes_nothing(workdir, capsys, setup, argv, said):
    setup(workdir)
    capsys.readouterr()
    try:
        code = main(["report", *argv])
    except SystemExit as exc:  # a bad flag: argparse's exit, with the usage error's code
        code = exc.code
    assert code == 2
    assert said in capsys.readouterr().err
    assert not list(workdir.glob("*.html")) and not list(workdir.glob(".*.tmp"))


def test_nothing_is_written_to_the_working_directorys_looptrace_folder(workdir, capsys):
    page_of(capsys, demos(workdir / "t.jsonl", "equipment"))
    assert not (workdir / ".looptrace").exists()


AGENTS = Path(__file__).parent / "foreign_agents.py"


@pytest.mark.slow
@pytest.mark.parametrize("producer, bare", [("semconv", False), ("openllmetry", True), ("openinference", False),
                                            ("pydantic-ai", True)])
def test_other_producers_runs_are_reported_as_detect_judges_them(tmp_path, capsys, producer, bare):
    trace_file = tmp_path / "spans.jsonl"
    done = subprocess.run([sys.executable, str(AGENTS), "--producer", producer, "--scenario", "repeat", "--file",
                           str(trace_file), *(["--bare"] if bare else [])], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    html = page_of(capsys, trace_file)
    page, expected = figures_of_page(html), figures_of_detect(detect_json(capsys, trace_file))
    assert page["looped"] == expected["looped"] == 1
    for figure in ("runs", "anomalies", "loop_tokens", "loop_usd", "statuses", "agents", "top_loops"):
        assert page[figure] == expected[figure], figure
    # The looping run is drawn: a model call per turn on the time axis, its loop over the turns `detect` names.
    found = elements(html)
    (band,) = [e for e in found if e["tag"] == "g" and e["attrs"].get("class") == "loop"]
    (verdict,) = [v for v in map(json.loads, detect_json(capsys, trace_file).splitlines()) if v["anomalies"]]
    (anomaly,) = verdict["anomalies"]
    since = (anomaly["cost"] or {}).get("since_turn") or anomaly["first_turn"]
    assert (band["attrs"]["data-first-turn"], band["attrs"]["data-last-turn"]) == (str(since), str(anomaly["turn"]))
    (section,) = [e for e in found if e["tag"] == "section" and e["attrs"].get("data-trace-id") == verdict["trace_id"]]
    assert section["attrs"]["data-turns"] == str(verdict["turns"])
    models = [e for e in found if e["tag"] == "rect" and e["attrs"].get("class") == "model" and section in e["parents"]]
    assert len(models) == verdict["turns"]
