"""`detect` over what a Langfuse project already holds (issue 21, part 1): "which of last week's runs looped?"

A project in the stand-in Langfuse API (tests/fakes/langfuse_api.py) holds looptrace's own traces and other producers'
(OpenTelemetry's GenAI utilities here; every real instrumentation package in the slow test), stored the way Langfuse's
OTel ingestion stores spans. A scan must give each run the verdict `looptrace detect` gives the same spans in a trace
file, through either of Langfuse's read APIs, and survive what a real server does: pages, 429s, bad keys, a backend
that is down, a malformed page, an interruption.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fakes.langfuse_api import OBSERVATIONS_PATH, TRACES_PATH, V2_PATH, FakeLangfuse
from fakes.otlp_receiver import unused_port
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from looptrace.cli.trace_commands import main as trace_commands
from looptrace.instrumentation.export.setup import configure
from looptrace.instrumentation.langfuse import mapping as langfuse_mapping
from looptrace.instrumentation.langfuse.api import (
    LangfuseAPI,
    LangfuseAuthError,
    LangfuseRateLimited,
    LangfuseUnavailable,
    MalformedPage,
    RetryPolicy,
)
from looptrace.instrumentation.langfuse.observations import trace_spans
from looptrace.instrumentation.langfuse.scan import CursorError, ScanQuery, scan
from looptrace.instrumentation.langfuse.scores import LangfuseScores, anomaly_score_body
from looptrace.instrumentation.recording import semconv as sc
from looptrace.runtime import Agent, ScriptedModel, tool

AGENTS = Path(__file__).parent / "foreign_agents.py"
APIS = ["v2", "v1"]


# --- the project: runs of looptrace's and of another producer -------------------------------------------------------


@tool
def get_order(order_id: str) -> str:
    """Look up an order.

    Args:
        order_id: Which order.
    """
    if order_id == "A-1":
        raise RuntimeError(f"order service unavailable for {order_id}")
    return json.dumps({"order_id": order_id, "status": "shipped"})


@tool
def refund(order_id: str) -> str:
    """Refund an order.

    Args:
        order_id: Which order.
    """
    raise RuntimeError(f"refund rejected for {order_id}: payment provider timeout")


@tool
def notify_customer(message: str) -> str:
    """Send the customer a message.

    Args:
        message: What to say.
    """
    return "sent"


@tool
def search(query: str) -> str:
    """Search the catalogue.

    Args:
        query: What to look for.
    """
    return "nothing new"


def call(name: str, n: int, **arguments: Any) -> dict[str, Any]:
    return {"stop_reason": "tool_use",
            "content": [{"type": "tool_use", "id": f"toolu_{name}_{n}", "name": name, "input": arguments}]}


def answer(text: str) -> dict[str, Any]:
    return {"stop_reason": "end_turn", "content": [{"type": "text", "text": text}]}


SCRIPTS = {
    "repeat_failing": [call("get_order", n, order_id="A-1") for n in range(4)]
    + [answer("I could not look up order A-1: the order service failed every time.")],
    "ignored_error": [call("refund", 1, order_id="A-1"), call("refund", 2, order_id="A-1"),
                      call("notify_customer", 1, message="Your request has been handled."),
                      answer("All done: the refund is issued and the customer has been notified.")],
    "clean": [call("get_order", 1, order_id="B-2"), answer("Order B-2 has shipped.")],
    "cycle": [call("search", n, query=q) for n, q in enumerate(["shoes", "boots"] * 3)] + [answer("Nothing found.")],
    "fails_twice": [call("get_order", n, order_id="A-1") for n in range(2)]
    + [answer("I could not look up order A-1: the order service failed.")],
}


def record_runs(path: Path, runs: list[tuple[str, dict[str, Any]]], *, environment: str | None = None,
                capture_content: bool = True) -> None:
    """looptrace runs, written by the default file writer, as `looptrace detect` would read them."""
    resource = {"service.name": "shop", **({"deployment.environment.name": environment} if environment else {})}
    provider = TracerProvider(resource=Resource.create(resource))
    telemetry = configure(exporters="file", trace_file=path, set_global=False, tracer_provider=provider)
    for script, labels in runs:
        agent = Agent("claude-sonnet-4-5", tools=[get_order, refund, notify_customer, search],
                      client=ScriptedModel(SCRIPTS[script]), tracer_provider=provider,
                      capture_content=capture_content)
        agent.run("What happened to order A-1?", **labels)
    telemetry.shutdown()
    provider.shutdown()


@dataclass
class Project:
    own: Path  # looptrace's runs
    quiet: Path  # looptrace without content capture, in another environment
    foreign: Path  # OpenTelemetry's GenAI utilities
    files: tuple[Path, ...]
    expected: dict[str, dict[str, Any]]  # trace id -> what `looptrace detect --json --all` says


def detect_file(*paths: Path, tmp: Path) -> dict[str, dict[str, Any]]:
    """`looptrace detect --json --all` over the spans of these files, by trace id."""
    merged = tmp / "merged.jsonl"
    merged.write_text("".join(path.read_text(encoding="utf-8") for path in paths), encoding="utf-8")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        trace_commands(["detect", "--json", "--all", str(merged)])
    verdicts = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    return {verdict["trace_id"]: without_loop_seconds(verdict) for verdict in verdicts}


def without_loop_seconds(verdict: dict[str, Any]) -> dict[str, Any]:
    """The verdict without its loops' wall time: Langfuse keeps times to the millisecond, so a loop's duration read
    back from it may differ from the file's by one (tokens and USD may not)."""
    for anomaly in verdict["anomalies"]:
        if anomaly.get("cost"):
            anomaly["cost"] = {k: v for k, v in anomaly["cost"].items() if k != "seconds"}
    return verdict


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Project:
    tmp = tmp_path_factory.mktemp("project")
    own, quiet, foreign = tmp / "own.jsonl", tmp / "quiet.jsonl", tmp / "semconv.jsonl"
    with contextlib.redirect_stdout(io.StringIO()):  # the agents' alerts print to stdout
        record_runs(own, [("repeat_failing", {"user_id": "ana", "tags": ["support"]}),
                          ("ignored_error", {"session_id": "conv-7"}), ("clean", {}), ("cycle", {}),
                          ("fails_twice", {"session_id": "conv-1"}), ("fails_twice", {"session_id": "conv-1"})])
        record_runs(quiet, [("repeat_failing", {})], environment="staging", capture_content=False)
    import foreign_agents  # OpenTelemetry's GenAI utilities patch nothing: they can run in this process

    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
        env.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
        for scenario in ("repeat_failing", "ignored_error"):
            assert foreign_agents.main(["--producer", "semconv", "--scenario", scenario, "--file", str(foreign)]) == 0
    files = (own, quiet, foreign)
    return Project(own, quiet, foreign, files, detect_file(*files, tmp=tmp))


def langfuse_with(project: Project, api: str = "v2", **options: Any) -> FakeLangfuse:
    fake = FakeLangfuse(v2=api == "v2", **options).start()
    for path in project.files:
        fake.ingest_file(path)
    return fake


def client_for(fake: FakeLangfuse, *, sleeps: list[float] | None = None, **options: Any) -> LangfuseAPI:
    def sleep(seconds: float) -> None:  # the waits the client asks for, in the order of the requests (no real wait)
        fake.log.append(("sleep", seconds))
        if sleeps is not None:
            sleeps.append(seconds)

    return LangfuseAPI(fake.url, fake.public_key, fake.secret_key, sleep=sleep, **options)


def by_trace(verdicts) -> dict[str, dict[str, Any]]:
    found = {}
    for verdict in verdicts:
        assert verdict.trace_id not in found, f"{verdict.trace_id} reported twice"
        found[verdict.trace_id] = without_loop_seconds(verdict.to_dict())
    return found


def requests_to(fake: FakeLangfuse, path: str) -> list[dict[str, list[str]]]:
    return [entry[2] for entry in fake.log if entry[0] == "GET" and entry[1] == path]


# --- the verdicts -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_each_run_in_the_project_gets_the_verdict_detect_gives_its_spans_in_a_file(project, api):
    found_types = {a["type"] for verdict in project.expected.values() for a in verdict["anomalies"]}
    assert found_types >= {"repeated_call", "ignored_error", "cycle"}  # the project is worth scanning
    foreign = {v["trace_id"] for v in project.expected.values() if v["name"] == "invoke_agent support-agent"}
    assert len(foreign) == 2 and all(project.expected[t]["anomalies"] for t in foreign)

    with langfuse_with(project, api) as fake:
        verdicts = by_trace(scan(client_for(fake), page_size=3))
        assert verdicts == project.expected
        if api == "v2":  # roots listed, then each trace read with the fields the converter needs
            listings = [r for r in requests_to(fake, V2_PATH) if "isRootObservation" in r]
            reads = [r for r in requests_to(fake, V2_PATH) if "traceId" in r]
            assert len(listings) == 3 and all(r["fields"] == ["core,basic"] for r in listings)  # 9 roots, by 3
            assert all("cursor" in r for r in listings[1:])
            assert {r["traceId"][0] for r in reads} == set(project.expected)  # each trace read, in pages of 3
            assert len(reads) > len(project.expected) and {r["fields"][0] for r in reads} == {"core,basic,io,metadata"}
            assert requests_to(fake, TRACES_PATH) == []
        else:  # a Langfuse without the v2 read path (v3 answers 404): the v1 endpoints, pages of at most 100
            assert len(requests_to(fake, V2_PATH)) == 1
            assert requests_to(fake, TRACES_PATH)[0]["orderBy"] == ["timestamp.asc"]
            assert len(requests_to(fake, OBSERVATIONS_PATH)) >= len(project.expected)


def test_verdicts_come_oldest_first_while_progress_is_reported(project):
    seen = []
    with langfuse_with(project) as fake:
        verdicts = list(scan(client_for(fake), on_progress=seen.append, page_size=2))
        starts = {o["traceId"]: o["startTime"] for o in fake.observations if o["parentObservationId"] is None}
    assert [starts[v.trace_id] for v in verdicts] == sorted(starts[v.trace_id] for v in verdicts)
    assert seen[0].phase == "listing" and seen[-1].phase == "done"
    assert seen[-1].total == seen[-1].judged == len(project.expected) == seen[-1].listed
    assert seen[-1].anomalies == sum(len(v["anomalies"]) for v in project.expected.values())
    assert [p.judged for p in seen if p.phase == "reading"] == sorted(p.judged for p in seen if p.phase == "reading")


@pytest.mark.parametrize("api", APIS)
def test_a_query_selects_a_window_a_session_a_user_tags_or_environments(project, api, tmp_path):
    now = datetime.now(UTC)
    fake = FakeLangfuse(v2=api == "v2").start()
    try:
        fake.ingest_file(project.own, shift_s=-10 * 86400)  # last week's (and older) runs, and this week's
        fake.ingest_file(project.quiet, shift_s=-3 * 86400)
        own = set(detect_file(project.own, tmp=tmp_path))
        quiet = set(detect_file(project.quiet, tmp=tmp_path))

        def traces(**query: Any) -> set[str]:
            return {v.trace_id for v in scan(client_for(fake), ScanQuery(**query))}

        assert traces(since=now - timedelta(days=7)) == quiet
        assert traces(until=now - timedelta(days=7)) == own
        assert traces(since=now - timedelta(days=11), until=now - timedelta(days=9)) == own
        sessions = {t for t, v in project.expected.items() if t in own and v["name"] == "invoke_agent agent"}
        conv_1 = traces(session_id="conv-1")
        assert len(conv_1) == 2 and conv_1 <= sessions
        assert len(traces(user_id="ana")) == 1 and traces(user_id="ana") == traces(tags=("support",))
        assert traces(tags=("support", "nothing-has-this")) == set()
        assert traces(environments=("staging",)) == quiet
        assert traces(environments=("staging", "default")) == own | quiet
        # The filters went to the server, in the parameters its API defines.
        traces(since=now - timedelta(days=11), until=now - timedelta(days=9), session_id="conv-1", user_id="ana",
               tags=("support",), environments=("staging", "default"))
        listing = requests_to(fake, V2_PATH if api == "v2" else TRACES_PATH)[-1]
        window = ("fromStartTime", "toStartTime") if api == "v2" else ("fromTimestamp", "toTimestamp")
        assert listing[window[0]][0].endswith("Z") and listing[window[1]][0].endswith("Z")
        assert (listing["sessionId"], listing["userId"], sorted(listing["environment"])) == (
            ["conv-1"], ["ana"], ["default", "staging"])
        if api == "v2":
            assert json.loads(listing["filter"][0]) == [{"type": "arrayOptions", "column": "tags",
                                                         "operator": "all of", "value": ["support"]}]
        else:
            assert listing["tags"] == ["support"]
    finally:
        fake.stop()


# --- scores ---------------------------------------------------------------------------------------------------------


def test_scoring_makes_each_finding_one_score_across_two_scans_with_the_live_paths_body_and_id(project):
    with langfuse_with(project) as fake:
        first = list(scan(client_for(fake), score=True))
        stored = dict(fake.scores)
        anomaly_scores = {i: s for i, s in stored.items() if s["name"] == langfuse_mapping.ANOMALY_SCORE}
        cost_scores = {i: s for i, s in stored.items() if s["name"] == langfuse_mapping.LOOP_COST_SCORE}
        assert len(anomaly_scores) + len(cost_scores) == len(stored)
        findings = {(v.trace_id, a.type) for v in first for a in v.anomalies}
        assert {(s["traceId"], s["value"]) for s in anomaly_scores.values()} == findings
        assert len(anomaly_scores) == len(findings)
        assert all(s["dataType"] == "CATEGORICAL" for s in anomaly_scores.values())
        # beside each, what the run's loops of that type cost (the runs recorded usage: priced by the table)
        priced = {(v.trace_id, kind): cost.usd for v in first for kind, cost in v.loop_cost_by_type.items()}
        assert {(s["traceId"], s["metadata"]["anomaly_type"]): s["value"] for s in cost_scores.values()} == priced
        assert all(s["dataType"] == "NUMERIC" for s in cost_scores.values())
        staging = [s for s in anomaly_scores.values() if s.get("environment") == "staging"]
        assert len(staging) == 1  # each score filed in its trace's environment; "default" is left to Langfuse

        second = list(scan(client_for(fake), score=True))
        assert [v.to_dict() for v in second] == [v.to_dict() for v in first]
        assert fake.scores == stored  # the same ids: the second scan updated nothing and added nothing
        assert len(fake.score_posts) == 2 * len(stored)

        # The body is the one LangfuseScores.anomaly sends for the same finding on the live path.
        verdict = next(v for v in first if v.anomalies and v.trace_id in {s["traceId"] for s in staging})
        anomaly = verdict.anomalies[-1]
        root = next(o["id"] for o in fake.observations if o["traceId"] == verdict.trace_id and
                    o["parentObservationId"] is None)
        live = LangfuseScores(fake.url, fake.public_key, fake.secret_key, environment="staging")
        live.anomaly(verdict.trace_id, anomaly.type, anomaly.message, span_id=root, cost=anomaly.cost)
        assert live.close(5.0)
        assert fake.score_posts[-1] == anomaly_score_body(verdict.trace_id, anomaly.type, anomaly.message,
                                                          span_id=root, environment="staging", cost=anomaly.cost)
        assert fake.scores == stored


# --- what a real server does ------------------------------------------------------------------------------------------


def test_a_429_is_waited_out_for_as_long_as_retry_after_asks(project):
    with langfuse_with(project) as fake:
        fake.fail(V2_PATH, 429, headers={"Retry-After": "7"}, skip=2)
        waits = []
        verdicts = by_trace(scan(client_for(fake), on_progress=lambda p: waits.append(p) if p.phase == "waiting"
                                 else None))
        assert verdicts == project.expected
        at = fake.log.index(("sleep", 7.0))
        refused, retried = fake.log[at - 1], fake.log[at + 1]
        assert refused[1] == retried[1] == V2_PATH and refused[2] == retried[2]  # the same request, after the wait
        assert [(w.wait_s, w.reason) for w in waits] == [(7.0, "rate limited (429)")]


def test_waits_are_bounded_and_retries_capped():
    with FakeLangfuse() as fake:
        sleeps: list[float] = []
        fake.fail(V2_PATH, 429, headers={"Retry-After": "3600"}, times=10)
        client = client_for(fake, sleeps=sleeps, retry=RetryPolicy(max_attempts=3, max_wait_s=5.0))
        with pytest.raises(LangfuseRateLimited, match="still rate limiting"):
            list(scan(client))
        assert sleeps == [5.0, 5.0]  # an hour asked, five seconds waited; three attempts, then the error
        fake.clear_faults()
        fake.fail(V2_PATH, 503, times=10)
        sleeps.clear()
        client = client_for(fake, sleeps=sleeps, retry=RetryPolicy(max_attempts=10, max_retries=4, backoff_s=0.5))
        with pytest.raises(LangfuseUnavailable, match="503"):
            list(scan(client))
        assert sleeps == [0.5, 1.0, 2.0, 4.0]  # backoff without Retry-After, and no more retries than the budget


@pytest.mark.parametrize("status", [401, 403])
def test_a_bad_key_is_a_typed_error_in_one_line_that_never_shows_a_key(status, project):
    secret = "sk-lf-0123-the-real-secret"
    with langfuse_with(project, forbidden=status == 403) as fake:
        url = fake.url
        if status == 401:
            client = LangfuseAPI(fake.url, fake.public_key, secret)
        else:
            client = LangfuseAPI(fake.url, fake.public_key, fake.secret_key)
            secret = fake.secret_key
        with pytest.raises(LangfuseAuthError) as caught:
            list(scan(client))
    message = str(caught.value)
    assert caught.value.status == status and "\n" not in message
    for shown in (message, repr(caught.value), repr(client), str(caught.value.__cause__)):
        assert secret not in shown and fake.public_key not in shown
    assert "LANGFUSE_SECRET_KEY" in message and url in message


def test_a_backend_that_is_down_is_a_typed_error_at_once():
    sleeps: list[float] = []
    client = LangfuseAPI(f"http://127.0.0.1:{unused_port()}", "pk-lf-down", "sk-lf-down", sleep=sleeps.append,
                         retry=RetryPolicy(max_attempts=3, backoff_s=0.25))
    with pytest.raises(LangfuseUnavailable, match="connection refused") as caught:
        list(scan(client))
    assert sleeps == [] and "sk-lf-down" not in str(caught.value)  # nothing listens: a retry cannot help


def test_a_backend_that_drops_connections_is_a_typed_error_after_bounded_retries():
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def drop_every_connection():
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            connection.close()  # accepted, then closed before any answer

    threading.Thread(target=drop_every_connection, daemon=True).start()
    sleeps: list[float] = []
    client = LangfuseAPI(f"http://127.0.0.1:{listener.getsockname()[1]}", "pk-lf-down", "sk-lf-down",
                         sleep=sleeps.append, retry=RetryPolicy(max_attempts=3, backoff_s=0.25))
    try:
        with pytest.raises(LangfuseUnavailable, match="connection failed") as caught:
            list(scan(client))
    finally:
        listener.close()
    assert sleeps == [0.25, 0.5] and "sk-lf-down" not in str(caught.value)


def test_a_malformed_page_names_the_page_and_loses_nothing_already_read(project, tmp_path):
    cursor = tmp_path / "scan.json"
    with langfuse_with(project) as fake:
        fake.fail(V2_PATH, 200, body='{"data": "not a list"}', skip=1)  # the listing's second page
        with pytest.raises(MalformedPage) as caught:
            list(scan(client_for(fake), cursor=cursor, page_size=3))
        assert caught.value.page == 2 and caught.value.endpoint == V2_PATH
        assert f"page 2 from {fake.url}{V2_PATH} is malformed: no data list (listing the traces" in str(caught.value)
        assert str(cursor) in str(caught.value)

        roots = sorted((o["startTime"], o["traceId"]) for o in fake.observations if o["parentObservationId"] is None)
        third = roots[2][1]  # traces are read oldest first: two verdicts, then a page of the third trace is bad
        fake.fail(V2_PATH, 200, body="<html>gateway</html>", match={"traceId": third})
        first = []
        with pytest.raises(MalformedPage, match=r"not JSON .*\(reading trace [0-9a-f]{32}"):
            for verdict in scan(client_for(fake), cursor=cursor, page_size=3):
                first.append(verdict)
        assert len(first) == 2
        listings = [r for r in requests_to(fake, V2_PATH) if "isRootObservation" in r]
        assert "cursor" in listings[-1]  # the listing went on from its second page, not from the start
        rest = list(scan(client_for(fake), cursor=cursor, page_size=3))
        assert by_trace(first + rest) == project.expected
        assert not cursor.exists()  # a finished scan leaves nothing to resume


# --- resuming -------------------------------------------------------------------------------------------------------


def test_an_interrupted_scan_resumes_from_its_cursor(project, tmp_path):
    cursor = tmp_path / "scan.json"
    with langfuse_with(project) as fake:
        fake.fail(V2_PATH, 503, times=100, skip=4)  # the listing and three traces, then the backend goes down
        first = []
        with pytest.raises(LangfuseUnavailable):
            for verdict in scan(client_for(fake, retry=RetryPolicy(max_attempts=2)), cursor=cursor, score=True):
                first.append(verdict)
        assert len(first) == 3 and cursor.exists()
        fake.clear_faults()
        reads_before = len(requests_to(fake, V2_PATH))
        rest = list(scan(client_for(fake), cursor=cursor, score=True))
        resumed = requests_to(fake, V2_PATH)[reads_before:]
    assert by_trace(first + rest) == project.expected
    assert not any("isRootObservation" in r for r in resumed)  # the listing was not read again
    assert {v.trace_id for v in first} & {r["traceId"][0] for r in resumed} == set()  # nor the judged traces
    anomaly_scores = [s for s in fake.scores.values() if s["name"] == langfuse_mapping.ANOMALY_SCORE]
    assert len(anomaly_scores) == sum(len({a["type"] for a in v["anomalies"]}) for v in project.expected.values())


def test_a_scan_its_reader_stopped_resumes_after_the_last_verdict_it_gave_and_keeps_a_sessions_memory(project,
                                                                                                   tmp_path):
    cursor = tmp_path / "scan.json"
    with langfuse_with(project) as fake:
        conversation = ScanQuery(session_id="conv-1")
        runs = scan(client_for(fake), conversation, cursor=cursor)
        first = next(runs)
        runs.close()  # Ctrl-C, or `| head -1`
        assert first.anomalies == []  # two failures: not a loop, yet
        rest = list(scan(client_for(fake), conversation, cursor=cursor))
    assert [v.trace_id for v in rest] != [first.trace_id] and len(rest) == 1
    # The same call failing twice more in the same conversation: a loop only with the first run remembered.
    assert [a.type for a in rest[0].anomalies] == ["repeated_call"]
    assert by_trace([first, *rest]) == {t: v for t, v in project.expected.items() if t in {first.trace_id,
                                                                                          rest[0].trace_id}}


def test_a_cursor_written_for_another_query_is_refused(project, tmp_path):
    cursor = tmp_path / "scan.json"
    with langfuse_with(project) as fake:
        runs = scan(client_for(fake), ScanQuery(session_id="conv-1"), cursor=cursor)
        next(runs)
        runs.close()
        with pytest.raises(CursorError, match="cursor of another scan"):
            list(scan(client_for(fake), ScanQuery(session_id="conv-7"), cursor=cursor))
        cursor.write_text("{not json", encoding="utf-8")
        with pytest.raises(CursorError, match="remove it to scan from the start"):
            list(scan(client_for(fake), ScanQuery(session_id="conv-1"), cursor=cursor))


# --- observations as Langfuse stores them ----------------------------------------------------------------------------


def test_observations_made_by_langfuses_own_sdks_are_read_from_their_own_fields():
    with FakeLangfuse() as fake:
        trace = "ab" * 16
        fake.add_observation(id="root", traceId=trace, type="AGENT", name="support-bot", startTime=stamp(0),
                             endTime=stamp(900), output="I could not look up the order.",
                             metadata={"resourceAttributes": {}, "scope": {"name": "langfuse-sdk"}})
        for n in range(4):
            fake.add_observation(id=f"llm-{n}", traceId=trace, parentObservationId="root", type="GENERATION",
                                 name="chat", startTime=stamp(10 + 200 * n), endTime=stamp(100 + 200 * n),
                                 output={"role": "assistant", "content": ""})
            fake.add_observation(id=f"tool-{n}", traceId=trace, parentObservationId="root", type="TOOL",
                                 name="get_order", startTime=stamp(110 + 200 * n), endTime=stamp(120 + 200 * n),
                                 input={"order_id": "A-1"}, output="Error: order service unavailable",
                                 level="ERROR", statusMessage="unavailable")
        (verdict,) = scan(client_for(fake))
    assert (verdict.name, verdict.turns, verdict.tool_calls) == ("support-bot", 4, 4)
    assert [(a.type, a.tool, a.count) for a in verdict.anomalies] == [("repeated_call", "get_order", 4)]
    assert "ignored_error" in verdict.rules_not_run  # no stop reason is stored: whether it was ignored is not guessed


def stamp(ms: int) -> str:
    moment = datetime(2026, 8, 3, 9, 0, tzinfo=UTC) + timedelta(milliseconds=ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def test_both_stored_metadata_shapes_give_the_same_spans_and_one_millisecond_keeps_its_order(project):
    with langfuse_with(project) as fake:
        trace = next(t for t, v in project.expected.items() if v["name"] == "invoke_agent agent" and
                     v["anomalies"] and v["anomalies"][0]["type"] == "cycle")
        v2 = [page for page in client_for(fake).v2_observations({"traceId": trace, "fields": "core,basic,io,metadata"})]
        v1 = list(client_for(fake).v1_pages(OBSERVATIONS_PATH, {"traceId": trace}))
    from_v2 = trace_spans([o for page in v2 for o in page.items])
    from_v1 = trace_spans([o for page in v1 for o in page.items])
    assert {s.span_id: s.attributes for s in from_v2} == {s.span_id: s.attributes for s in from_v1}
    assert any(f"attributes.{sc.GEN_AI_OPERATION_NAME}" in o["metadata"] for o in v2[0].items)  # flat, as v4 stores it
    assert all(isinstance(o["metadata"]["attributes"], dict) for o in v1[0].items)  # nested, as v3 stores it
    # A scripted run fits in a few milliseconds: spans come children first, and a turn's calls start after its
    # model call and before the next turn's, as they ran.
    spans = from_v2
    assert spans[-1].parent_span_id is None and len({s.start_ns for s in spans}) == len(spans)
    turns = sorted((s for s in spans if s.name == sc.TURN_SPAN_NAME), key=lambda s: s.start_ns)
    assert [t.attributes[sc.TURN_INDEX] for t in turns] == list(range(1, len(turns) + 1))
    tools = sorted((s for s in spans if s.name.startswith("execute_tool")), key=lambda s: s.start_ns)
    assert [t.attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS] for t in tools] == [
        json.dumps({"query": q}, separators=(",", ":")) for q in ["shoes", "boots"] * 3]


# --- every producer's real package ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("producer", ["semconv", "semconv-chat", "openllmetry", "openinference", "pydantic-ai"])
def test_other_producers_real_traces_get_the_verdicts_detect_gives_them(tmp_path, producer):
    files = []
    for scenario in ("repeat_failing", "ignored_error", "clean"):
        path = tmp_path / f"{producer}-{scenario}.jsonl"
        done = subprocess.run([sys.executable, str(AGENTS), "--producer", producer, "--scenario", scenario,
                               "--file", str(path)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        files.append(path)
    expected = detect_file(*files, tmp=tmp_path)
    assert len(expected) == 3
    for api in APIS:
        with FakeLangfuse(v2=api == "v2") as fake:
            for path in files:
                fake.ingest_file(path)
            assert by_trace(scan(client_for(fake))) == expected, api


def without_roots(source: Path, target: Path, count: int) -> set[str]:
    """The file's spans minus the agent spans of its first ``count`` runs, as if those processes had been killed
    mid-run; the ids of those traces."""
    lines, dropped = [], set()
    for line in source.read_text(encoding="utf-8").splitlines():
        span = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        if not span.get("parentSpanId") and len(dropped) < count:
            dropped.add(span["traceId"])
            continue
        lines.append(line)
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dropped


@pytest.mark.parametrize("api", APIS)
def test_runs_whose_root_never_reached_langfuse_are_judged_at_the_end_once_even_across_a_stop(project, tmp_path,
                                                                                                api):
    killed = tmp_path / "killed.jsonl"
    rootless = without_roots(project.own, killed, 2)
    expected = detect_file(killed, tmp=tmp_path)
    assert rootless <= set(expected) and any(expected[t]["anomalies"] for t in rootless)
    cursor = tmp_path / "scan.json"
    with FakeLangfuse(v2=api == "v2") as fake:
        fake.ingest_file(killed)
        if api == "v2":  # found by their root observation, these traces have none: only a listing of them all
            assert {v.trace_id for v in scan(client_for(fake))} == set(expected) - rootless
        query = ScanQuery(rootless=True)
        first = []
        for verdict in scan(client_for(fake), query, cursor=cursor):
            first.append(verdict)
            if verdict.trace_id in rootless:
                break  # stopped among the runs judged at the end
        reads_before = len(fake.log)
        rest = list(scan(client_for(fake), query, cursor=cursor))
        read_again = {entry[2]["traceId"][0] for entry in fake.log[reads_before:] if "traceId" in entry[2]}
    assert first[-1].trace_id in rootless and [v.trace_id for v in first[:-1]] == [
        v.trace_id for v in first[:-1] if v.trace_id not in rootless]
    assert by_trace(first + rest) == expected
    assert read_again == rootless  # read again for the rebuilder's memory, reported once


def test_a_page_that_points_at_itself_ends_the_read_instead_of_looping():
    with FakeLangfuse() as fake:
        same = json.dumps({"data": [{"id": "o1", "traceId": "ab" * 16, "startTime": stamp(0), "isRootObservation": True}],
                           "meta": {"cursor": "c2FtZQ=="}})
        fake.fail(V2_PATH, 200, body=same, times=3)
        with pytest.raises(MalformedPage, match=r"page 2 .* points at the page itself"):
            list(scan(client_for(fake)))


# --- `looptrace detect --langfuse`: the command a person runs ---------------------------------------------------------


def detect_langfuse(fake: FakeLangfuse, *args: str, secret: str | None = None,
                    monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """`looptrace detect --langfuse ...` in process, with the stand-in's keys in the environment."""
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", fake.public_key)
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", secret or fake.secret_key)
    monkeypatch.setenv("LANGFUSE_BASE_URL", fake.url)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = trace_commands(["detect", "--langfuse", *args])
    return code, out.getvalue(), err.getvalue()


def test_detect_langfuse_prints_what_detect_prints_for_the_same_spans(project, monkeypatch):
    with langfuse_with(project) as fake:
        code, out, err = detect_langfuse(fake, "--json", "--all", monkeypatch=monkeypatch)
    assert code == 1  # anomalies found, as `detect` says it
    found = {v["trace_id"]: without_loop_seconds(v) for v in map(json.loads, out.splitlines())}
    assert found == project.expected


def test_detect_langfuse_scores_each_finding_once_across_two_scans(project, monkeypatch):
    with langfuse_with(project) as fake:
        for _ in range(2):
            code, _, err = detect_langfuse(fake, "--score", monkeypatch=monkeypatch)
            assert code == 1 and "scores posted" in err.splitlines()[-1]
        posts = [entry for entry in fake.log if entry[0] == "POST" and entry[1].endswith("/scores")]
        stored = dict(fake.scores)
    findings = {(t, a["type"]) for t, v in project.expected.items() if len(t) == 32 for a in v["anomalies"]}
    anomaly_scores = [s for s in stored.values() if s["name"] == langfuse_mapping.ANOMALY_SCORE]
    assert {(s["traceId"], s["value"]) for s in anomaly_scores} == findings  # one score per finding ...
    assert len(posts) == 2 * len(stored)  # ... posted by each scan with the same id: the second updates it
    # and one loop_cost_usd per run and anomaly type, what its loops cost
    assert {s["name"] for s in stored.values()} == {langfuse_mapping.ANOMALY_SCORE, langfuse_mapping.LOOP_COST_SCORE}


def test_detect_langfuse_with_a_bad_key_is_one_line_and_exit_2(project, monkeypatch):
    with langfuse_with(project) as fake:
        code, out, err = detect_langfuse(fake, secret="sk-lf-wrong-secret", monkeypatch=monkeypatch)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("looptrace: error: ")
    assert "sk-lf-wrong-secret" not in err and fake.secret_key not in err


def test_detect_langfuse_refuses_a_file_and_a_bad_time(project, monkeypatch, tmp_path):
    with langfuse_with(project) as fake:
        code, _, err = detect_langfuse(fake, str(tmp_path / "traces.jsonl"), monkeypatch=monkeypatch)
        assert code == 2 and "not both" in err
        with pytest.raises(SystemExit) as exited:
            detect_langfuse(fake, "--since", "last tuesday", monkeypatch=monkeypatch)
    assert exited.value.code == 2
