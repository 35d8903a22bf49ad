"""The trace file holds what a run recorded once: the GenAI conventions and looptrace.*, no backend's attributes,
each message of a run once, the resource once per process and file; every backend still gets what it got, and
files written before all this read as they did.

``tests/data/trace_file_0_3.jsonl`` was written by looptrace 0.3.0 before these changes (the equipment story with
labels, the runaway run the detector stops, the ignored error, a continued history), as ``configure(exporters="file")``
wrote it then: every line with its resource, Langfuse's and OpenInference's attributes on every span.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from fakes.otlp_receiver import OTLPReceiver, langfuse_view
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from looptrace import Agent, ScriptedModel, configure
from looptrace.cli.demo import DEMO_SYSTEM, DEMO_TASK, Inventory, equipment_script, ignored_error_script, runaway_script
from looptrace.cli.trace_commands import main as trace_commands
from looptrace.instrumentation.alerts import AlertContext, Alerts
from looptrace.instrumentation.export.push import push, spans_as_sent
from looptrace.instrumentation.recording import semconv as sc
from looptrace.instrumentation.settings import Settings
from looptrace.instrumentation.tracefile.read import read_spans, spans_of_traces_data, trace_files
from looptrace.instrumentation.tracefile.write import Rotation, TraceFileProcessor
from looptrace.instrumentation.watch import RunWatcher

OLD_FILE = Path(__file__).parent / "data" / "trace_file_0_3.jsonl"
PUBLIC, SECRET = "pk-lf-size", "sk-lf-size"
VENDOR_PREFIXES = ("langfuse.", "openinference.", "input.", "output.", "llm.", "session.id")
QUIET = Alerts(log_warnings=False)


def vendor_keys(spans) -> list[tuple[str, str]]:
    return [(s.name, key) for s in spans for key in s.attributes if key.startswith(VENDOR_PREFIXES)]


def written_like_the_old_file(path: Path, telemetry) -> None:
    """The runs of the 0.3 file again, recorded now."""
    def agent(script, **options):
        return Agent("claude-sonnet-5-5", tools=Inventory().tools(), system=DEMO_SYSTEM, client=ScriptedModel(script),
                     telemetry=telemetry, alerts=QUIET, **options)

    agent(equipment_script(), name="booking").run(DEMO_TASK, session_id="S-42", user_id="ana", tags=["demo"],
                                                  metadata={"ticket": "T-9"})
    agent(runaway_script()).run("Find a projector")
    agent(ignored_error_script(), on_anomaly="warn").run(DEMO_TASK)
    history = [{"role": "user", "content": DEMO_TASK},
               {"role": "assistant", "content": [{"type": "text", "text": "Which date?"}]},
               {"role": "user", "content": "2026-10-08, please."}]
    agent(equipment_script(), name="booking").run(history, session_id="S-42")


@pytest.fixture
def new_file(tmp_path) -> Path:
    path = tmp_path / "traces.jsonl"
    telemetry = configure(exporters="file", trace_file=path, set_global=False)
    try:
        written_like_the_old_file(path, telemetry)
    finally:
        telemetry.shutdown()
    return path


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = trace_commands(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- what the file holds, what backends get -------------------------------------------------------------------------


def test_the_trace_file_holds_no_backends_attributes_while_langfuse_gets_them_all(tmp_path):
    path = tmp_path / "traces.jsonl"
    with OTLPReceiver(basic_auth=(PUBLIC, SECRET), path_prefix="/api/public/otel") as langfuse:
        settings = Settings.from_env({"LANGFUSE_PUBLIC_KEY": PUBLIC, "LANGFUSE_SECRET_KEY": SECRET,
                                      "LANGFUSE_BASE_URL": langfuse.base_url})
        telemetry = configure(settings, exporters="file,langfuse", trace_file=path, set_global=False,
                              undelivered_file=tmp_path / "undelivered.jsonl")
        try:
            Agent("claude-sonnet-5-5", tools=Inventory().tools(), system=DEMO_SYSTEM, alerts=QUIET,
                  client=ScriptedModel(equipment_script()), telemetry=telemetry).run(
                DEMO_TASK, session_id="S-42", user_id="ana", tags=["demo"], metadata={"ticket": "T-9"})
        finally:
            telemetry.shutdown()
        received = langfuse.wait_for_spans(12)
    stored = list(read_spans(path))
    assert len(stored) == len(received) == 12
    assert vendor_keys(stored) == []
    root = next(s for s in stored if s.parent_span_id is None).attributes  # the labels, in the conventions' words
    assert (root[sc.USER_ID], root[sc.RUN_TAGS], root[sc.RUN_METADATA_PREFIX + "ticket"]) == ("ana", ["demo"], "T-9")
    for span in received:  # Langfuse sees every observation as before: its exporter added its attributes
        seen = langfuse_view(span)
        assert (seen.trace_name, seen.session_id, seen.user_id, seen.tags) == ("agent", "S-42", "ana", ["demo"])
        assert span.attributes[sc.OPENINFERENCE_SPAN_KIND]


def test_each_message_is_written_once_and_push_sends_every_input_whole_again(tmp_path):
    # Runs long enough that their history outgrows a small size cap: the newest messages that fit move on.
    path = tmp_path / "traces.jsonl"
    telemetry = configure(Settings(max_attribute_chars=900), exporters="file", trace_file=path, set_global=False)
    made = InMemorySpanExporter()
    telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(made))
    try:
        for script in (equipment_script(), runaway_script()):
            Agent("claude-sonnet-5-5", tools=Inventory().tools(), system=DEMO_SYSTEM, alerts=QUIET,
                  client=ScriptedModel(script), telemetry=telemetry, on_anomaly="warn").run(DEMO_TASK)
    finally:
        telemetry.shutdown()
    original = {format(s.context.span_id, "016x"): s for s in made.get_finished_spans()}
    stored = {s.span_id: s for s in read_spans(path)}
    chats = [i for i, s in stored.items() if s.name.startswith("chat ")]
    continued = [i for i in chats if sc.INPUT_CONTINUES in stored[i].attributes]
    assert len(continued) == len(chats)  # every call continues its run's root or the call before it
    assert any(sc.INPUT_CONTINUES_FROM in stored[i].attributes for i in continued)  # the window moved on
    written = sum(len(stored[i].attributes[sc.GEN_AI_INPUT_MESSAGES]) for i in chats)
    made_inputs = sum(len(original[i].attributes[sc.GEN_AI_INPUT_MESSAGES]) for i in chats)
    assert written * 3 < made_inputs

    tools = [s for s in stored.values() if s.name.startswith("execute_tool ")]
    assert tools and not any(sc.GEN_AI_TOOL_DESCRIPTION in s.attributes for s in tools)  # the root's definitions have it
    sent = {format(s.context.span_id, "016x"): s for s in spans_as_sent(path, "otlp")}
    for span_id, span in original.items():  # what a backend gets from the file: the spans as they were made
        assert dict(sent[span_id].attributes) == dict(span.attributes), span.name


def test_the_resource_is_written_whole_once_per_process_and_file_and_read_back_whole(tmp_path):
    path = tmp_path / "traces.jsonl"
    providers = []
    for service in ("checkout", "billing"):  # two processes' writers of one file, alternating
        provider = TracerProvider(resource=Resource.create({"service.name": service, "deployment.environment": "ci"}))
        provider.add_span_processor(TraceFileProcessor(path, Rotation(max_bytes=6_000, backups=20)))
        providers.append(provider)
    for n in range(40):
        providers[n % 2].get_tracer("app").start_span(f"work {n}", attributes={"n": n, "pad": "x" * 200}).end()
    for provider in providers:
        provider.shutdown()
    files = trace_files(path)
    assert len(files) > 3  # rotated several times
    whole = [line for name in files for line in Path(name).read_text().splitlines() if "telemetry.sdk.name" in line]
    assert 2 <= len(whole) <= 2 * len(files)  # once per writer and file, not once per span
    records = list(read_spans(path))
    assert len(records) == 40
    for record in records:
        expected = providers[record.attributes["n"] % 2].resource.attributes
        assert {k: v for k, v in record.resource.items() if k != sc.RESOURCE_ID} == dict(expected)
    newest_alone = tmp_path / "alone" / "traces.jsonl"  # each file stands on its own: its lines define theirs
    newest_alone.parent.mkdir()
    shutil.copy(files[-1], newest_alone)
    assert all(r.resource.get("telemetry.sdk.name") == "opentelemetry" for r in read_spans(newest_alone))


def test_two_agents_with_pipelines_of_their_own_share_a_rotating_file_and_lose_no_span(tmp_path, monkeypatch):
    from opentelemetry import trace

    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    path = tmp_path / "traces.jsonl"
    settings = Settings.from_env({"LOOPTRACE_TRACE_FILE": str(path), "LOOPTRACE_TRACE_FILE_MAX_BYTES": "20000",
                                  "LOOPTRACE_TRACE_FILE_BACKUPS": "50"})
    agents = [Agent("claude-sonnet-5-5", tools=Inventory().tools(), client=ScriptedModel(equipment_script() * 3),
                    settings=settings, alerts=QUIET) for _ in range(2)]
    trace_ids = [agents[n % 2].run(DEMO_TASK).trace_id for n in range(6)]
    del agents  # their pipelines close as they go
    import gc

    gc.collect()
    bad = []
    records = list(read_spans(path, on_bad_line=bad.append))
    assert bad == [] and len(trace_files(path)) > 2
    assert sorted({r.trace_id for r in records}) == sorted(trace_ids)
    assert len(records) == 6 * 12


# --- files written before: every reader reads them as it did --------------------------------------------------------


def run_rows(capsys, path: Path) -> list[str]:
    """`traces list`'s lines without what differs from one recording to the next: ids, start times, durations, and
    the anomaly counts the detector of the day recorded (``detected`` compares what today's detector finds)."""
    code, out, err = cli(capsys, "traces", "list", "--file", str(path))
    assert code == 0, err
    return sorted(re.sub(r", \d+ anomal.*$", "", " ".join(line.split()[3:-2])) for line in out.splitlines())


def detected(capsys, path: Path) -> list[tuple]:
    code, out, err = cli(capsys, "detect", str(path), "--json")
    assert code in (0, 1), err  # 1: anomalies found
    runs = [json.loads(line) for line in out.splitlines()]
    return sorted((run["name"], run["status"], sorted((a["type"], a["turn"]) for a in run["anomalies"]),
                   len(run["unresolved_errors"])) for run in runs)


def test_detect_and_traces_list_read_a_file_of_before_as_they_read_one_of_now(capsys, new_file):
    assert run_rows(capsys, OLD_FILE) == run_rows(capsys, new_file)
    old_findings = detected(capsys, OLD_FILE)
    assert old_findings == detected(capsys, new_file)
    assert any(anomalies for _, _, anomalies, _ in old_findings)  # the runaway run
    assert any(unresolved for *_, unresolved in old_findings)


def test_traces_show_renders_a_run_of_each(capsys, new_file):
    for path in (OLD_FILE, new_file):
        [booking] = [r for r in read_spans(path) if r.name == "invoke_agent booking"
                     and r.attributes.get(sc.GEN_AI_INPUT_MESSAGES, "").count('"role"') == 1]
        code, out, err = cli(capsys, "traces", "show", "--file", str(path), "--trace-id", booking.trace_id[:12])
        assert code == 0, err
        assert out.splitlines()[0].startswith("invoke_agent booking")
        assert out.count("execute_tool ") == 3 and out.count("chat claude-sonnet-5-5") == 4


def test_replay_replays_a_run_of_each(capsys, new_file):
    from looptrace.cli.app import main

    for path in (OLD_FILE, new_file):
        [booking] = [r for r in read_spans(path) if r.name == "invoke_agent booking"
                     and r.attributes.get(sc.GEN_AI_INPUT_MESSAGES, "").count('"role"') == 1]
        code = main(["replay", "--file", str(path), "--trace-id", booking.trace_id, "--json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        replayed = json.loads(out)
        assert replayed["trace_id"] == booking.trace_id and replayed["replayed"]["status"] == "done"
        assert replayed["diff"] == {"same": [], "gone": [], "new": []}


def test_watch_judges_the_lines_of_either_file_alike(new_file):
    def found(path: Path) -> list[tuple[str, int]]:
        seen: list[tuple[str, int]] = []

        def note(anomaly, context: AlertContext) -> None:
            seen.append((anomaly.type, anomaly.turn))

        watcher = RunWatcher(Alerts(callback=note, log_warnings=False), capture_content=True)
        for line in path.read_text().splitlines():  # as the Collector's otlpjsonfile receiver would send them
            watcher.ingest(list(spans_of_traces_data(json.loads(line))))
        watcher.close_all()
        return sorted(seen)

    old = found(OLD_FILE)
    assert old and old == found(new_file)


def test_push_sends_the_spans_of_a_file_of_before_as_langfuse_got_them_then(tmp_path):
    path = tmp_path / "traces.jsonl"
    shutil.copy(OLD_FILE, path)
    listed = tmp_path / "undelivered.jsonl"
    keys = [f"{r.trace_id}{r.span_id}" for r in read_spans(path)]
    listed.write_text(json.dumps({"backend": "langfuse", "file": str(path), "undelivered": keys,
                                  "uncertain": False}) + "\n")
    with OTLPReceiver(basic_auth=(PUBLIC, SECRET), path_prefix="/api/public/otel") as langfuse:
        settings = Settings.from_env({"LANGFUSE_PUBLIC_KEY": PUBLIC, "LANGFUSE_SECRET_KEY": SECRET,
                                      "LANGFUSE_BASE_URL": langfuse.base_url})
        report = push(listed, settings=settings, post_score=lambda body: True)
        received = {s.span_id: s for s in langfuse.wait_for_spans(len(keys))}
    assert report.ok and report.sent["langfuse"] == len(keys)
    stored = {r.span_id: r for r in read_spans(path)}
    for span_id, span in received.items():  # the old file already held Langfuse's attributes: they win
        mine = {k: v for k, v in stored[span_id].attributes.items() if k.startswith(VENDOR_PREFIXES)}
        assert {k: span.attributes[k] for k in mine} == {k: list(v) if isinstance(v, tuple) else v
                                                         for k, v in mine.items()}


# --- rotation: what it keeps, and saying what it deleted -------------------------------------------------------------


def test_traces_list_says_when_older_runs_rotated_away(capsys, tmp_path):
    path = tmp_path / "traces.jsonl"

    def runs(rotation: Rotation, count: int) -> None:
        provider = TracerProvider()
        provider.add_span_processor(TraceFileProcessor(path, rotation))
        for _ in range(count):
            Agent("claude-sonnet-5-5", tools=Inventory().tools(), client=ScriptedModel(equipment_script()),
                  tracer_provider=provider, alerts=QUIET).run(DEMO_TASK)
        provider.shutdown()

    runs(Rotation(max_bytes=15_000, backups=50), 3)  # rotated, nothing deleted yet
    code, out, err = cli(capsys, "traces", "list", "--file", str(path))
    assert code == 0 and len(out.splitlines()) == 3 and "rotated away" not in err
    runs(Rotation(max_bytes=15_000, backups=1), 3)  # now the oldest files go
    code, out, err = cli(capsys, "traces", "list", "--file", str(path))
    assert code == 0 and len(out.splitlines()) < 6
    [said] = [line for line in err.splitlines() if "rotated away" in line]
    assert said.startswith("looptrace: runs written before ") and "keeps 1 older file of 15 KiB" in said
    assert "LOOPTRACE_TRACE_FILE_BACKUPS" in said
