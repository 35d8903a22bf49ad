"""The producer matrix (docs/watch.md): every producer people instrument an Anthropic agent with, as its
real package from PyPI, bare (no agent span, no session id, the global tracer provider) and wrapped, each in a
looping and a clean variant, read by `looptrace detect` from a file.

Each row is run here by tests/foreign_agents.py against the fake Messages API, except the current OpenLLMetry's
(tests/test_current_producers.py: it needs a venv of its own). The table there is checked against `ROWS`: a row
there that is not tested here, or that claims another outcome, fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from looptrace.cli.app import main
from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.watch import WatchServer, WatchSettings

TESTS = Path(__file__).parent
AGENTS = TESTS / "foreign_agents.py"
WATCH_GUIDE = TESTS.parent / "docs" / "watch.md"
LOOP_CALLS = 8  # the `repeat` scenario: get_order(A-1) eight times, the same answer each time
NO_ERROR_FLAG = frozenset({"ignored_error", "failing_tool"})  # tool results read from messages without is_error
NO_ANSWER_TEXT = frozenset({"ignored_error", "repeated_text"})  # the SDK's own spans record no message at all
NO_TOOL_CALLS = frozenset({"repeated_call", "cycle", "failing_tool"})  # model calls that asked for tools, none recorded


@dataclass(frozen=True)
class Row:
    """One producer in one layout, and what `detect` makes of its spans."""

    id: str  # as the table in docs/watch.md names it
    producer: str  # tests/foreign_agents.py --producer
    bare: bool
    joined: bool = True  # the run's model calls come together as one run (by parent span, session or history)
    tools_known: bool = True  # tool calls (and so repeats) can be read from the spans
    not_run: frozenset[str] = frozenset()  # the rules `detect --json` lists under rules_not_run
    here: bool = True  # run by this module (else by tests/test_current_producers.py)

    @property
    def flagged(self) -> bool:
        """Whether the looping variant raises `repeated_call`."""
        return self.joined and self.tools_known


ROWS = (
    Row("openllmetry-current/bare", "openllmetry", True, not_run=NO_ERROR_FLAG, here=False),
    Row("openllmetry-current/wrapped", "openllmetry", False, not_run=NO_ERROR_FLAG, here=False),
    Row("openllmetry-0.53/bare", "openllmetry", True),
    Row("openllmetry-0.53/wrapped", "openllmetry", False),
    Row("openinference/bare", "openinference", True, not_run=NO_ERROR_FLAG),
    Row("openinference/wrapped", "openinference", False),
    Row("genai-anthropic/bare", "genai-anthropic", True, not_run=NO_ERROR_FLAG),
    Row("genai-anthropic/wrapped", "genai-anthropic", False, not_run=NO_ERROR_FLAG),
    Row("anthropic-sdk/bare", "anthropic-sdk", True, joined=False, tools_known=False, not_run=NO_ANSWER_TEXT),
    Row("anthropic-sdk/wrapped", "anthropic-sdk", False, tools_known=False, not_run=NO_ANSWER_TEXT),
    Row("pydantic-ai/bare", "pydantic-ai", True),
    Row("pydantic-ai/wrapped", "pydantic-ai", False),
    Row("langfuse/bare", "langfuse", True, not_run=NO_ERROR_FLAG),
    Row("langfuse/wrapped", "langfuse", False, not_run=NO_ERROR_FLAG),
)


@pytest.fixture(scope="module")
def produced(request, tmp_path_factory) -> dict[tuple[str, str], Path]:
    """The span file of every (row, scenario) this session's matrix tests ask for. One process per row (an
    instrumentation patches the SDK globally) runs its scenarios one after the other, set up once as an app is; the
    rows run side by side, since most of a process's time is its imports."""
    scenarios: dict[Row, list[str]] = {}
    for item in request.session.items:
        if getattr(item, "originalname", "") == "test_the_producer_matrix_row":
            scenarios.setdefault(item.callspec.params["row"], []).append(item.callspec.params["scenario"])
    folder = tmp_path_factory.mktemp("producer-matrix")

    def path_of(row: Row, scenario: str) -> Path:
        return folder / f"{row.id.replace('/', '-')}-{scenario}.jsonl"

    def produce(row: Row, wanted: list[str]) -> None:
        first, *then = wanted
        run_agent(row, first, "--file", str(path_of(row, first)),
                  *[flag for scenario in then for flag in ("--then", f"{scenario}={path_of(row, scenario)}")])

    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        for future in [pool.submit(produce, row, wanted) for row, wanted in scenarios.items()]:
            future.result()
    return {(row.id, scenario): path_of(row, scenario) for row, wanted in scenarios.items() for scenario in wanted}


def run_agent(row: Row, scenario: str, *flags: str) -> None:
    completed = subprocess.run([sys.executable, str(AGENTS), "--producer", row.producer, "--scenario", scenario,
                                *flags, *(["--bare"] if row.bare else [])],
                               capture_output=True, text=True, timeout=180)
    assert completed.returncode == 0, completed.stderr[-2000:]


def expected_runs(row: Row, model_calls: int) -> list[tuple[int, int]]:
    """(turns, tool calls) of each run `detect` should report for a conversation of ``model_calls`` calls."""
    tool_calls = model_calls - 1 if row.tools_known else 0
    if row.joined:
        return [(model_calls, tool_calls)]
    return [(1, 0)] * model_calls  # every model call a run of its own: nothing ties them together


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["repeat", "clean"])
@pytest.mark.parametrize("row", [row for row in ROWS if row.here], ids=lambda row: row.id)
def test_the_producer_matrix_row(produced, capsys, row, scenario):
    path = produced[row.id, scenario]
    code = main(["detect", "--json", "--all", str(path)])
    verdicts = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    model_calls = LOOP_CALLS + 1 if scenario == "repeat" else 2
    assert sorted((v["turns"], v["tool_calls"]) for v in verdicts) == expected_runs(row, model_calls), verdicts
    flagged = scenario == "repeat" and row.flagged
    assert [a["type"] for v in verdicts for a in v["anomalies"]] == (["repeated_call"] if flagged else [])
    assert code == (1 if flagged else 0)
    # What the producer did not record is named, not guessed. Without tool calls in the spans, a run whose model
    # asked for tools (several model calls, or a stop reason saying so) says the loop rules could not run.
    not_run = [set(verdict["rules_not_run"]) for verdict in verdicts]
    if row.tools_known:
        assert all(rules == row.not_run for rules in not_run), not_run
    else:
        assert all(row.not_run <= rules <= row.not_run | NO_TOOL_CALLS for rules in not_run), not_run
        if row.joined:  # a run of several model calls and not one tool call recorded
            assert all(rules == row.not_run | NO_TOOL_CALLS for rules in not_run), not_run


@pytest.mark.slow
def test_watch_flags_every_bare_loop_it_can_over_otlp():
    # The bare rows as most people run them, exported over OTLP/HTTP to one watch: each loop that detect flags is
    # flagged live too (its conversation rebuilt from the history as the calls arrive), each under its own service.
    bare = [row for row in ROWS if row.here and row.bare and row.flagged and row.producer != "openllmetry"]
    alerts: list[str] = []
    server = WatchServer(WatchSettings(port=0, grpc_port=None),
                         alerts=Alerts(callback=lambda anomaly, context: alerts.append(anomaly.type))).start()
    try:
        for row in bare:  # OpenLLMetry's bare rows have their own watch tests (test_watch, test_current_producers)
            run_agent(row, "repeat", "--service", row.producer, "--otlp", f"http://127.0.0.1:{server.port}/v1/traces")
        assert server.wait_idle()
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as response:
            metrics = response.read().decode()
    finally:
        server.stop()
    assert alerts == ["repeated_call"] * len(bare)
    for row in bare:
        assert f'anomaly_type="repeated_call",service="{row.producer}"}} 1.0' in metrics, row.id


def readme_matrix() -> dict[str, str]:
    """docs/watch.md's producer matrix: each row's id and its "looping variant" cell."""
    text = WATCH_GUIDE.read_text()
    table = text.split("<!-- producer-matrix -->", 1)[1].split("<!-- /producer-matrix -->", 1)[0]
    rows: dict[str, str] = {}
    header: list[str] = []
    for line in table.strip().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not header:
            header = cells
            continue
        if set(cells[0]) <= set("-: "):
            continue
        found = re.search(r"`([\w.-]+/(?:bare|wrapped))`", cells[0])
        assert found, f"a matrix row without its id: {line}"
        rows[found.group(1)] = cells[header.index("looping variant")]
    return rows


def test_the_readme_matrix_is_the_tested_one():
    documented = readme_matrix()
    assert sorted(documented) == sorted(row.id for row in ROWS)
    for row in ROWS:
        claims_flagged = "`repeated_call`" in documented[row.id]
        assert claims_flagged == row.flagged, f"{row.id}: docs/watch.md says {documented[row.id]!r}"


def test_an_instrumentations_call_span_around_the_sdks_own_counts_once_when_the_history_joins_it(tmp_path, capsys):
    # OpenInference and OpenTelemetry's GenAI instrumentation wrap the SDK method, so with a global provider the SDK's
    # messageless span of the call is the CHILD of theirs. Their span joins its conversation; the trace it leaves
    # behind (that child alone) must not become a one-call run of its own.
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from looptrace.instrumentation.tracefile import OTLPJsonFileExporter

    path = tmp_path / "spans.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPJsonFileExporter(str(path))))
    tracer = provider.get_tracer("instrumentation")
    user = {"role": "user", "parts": [{"type": "text", "content": "What happened to order A-1?"}]}
    call = {"role": "assistant", "parts": [
        {"type": "tool_call", "id": "toolu_1", "name": "get_order", "arguments": {"order_id": "A-1"}}]}
    result = {"role": "tool", "parts": [{"type": "tool_call_response", "id": "toolu_1", "response": "shipped"}]}
    answer = {"role": "assistant", "parts": [{"type": "text", "content": "It has shipped."}], "finish_reason": "stop"}
    for n, (history, output) in enumerate([([user], {**call, "finish_reason": "tool_call"}),
                                           ([user, call, result], answer)], start=1):
        with tracer.start_as_current_span("chat claude-sonnet-4-6", attributes={
                "gen_ai.operation.name": "chat", "gen_ai.response.id": f"msg_{n}",
                "gen_ai.input.messages": json.dumps(history), "gen_ai.output.messages": json.dumps([output])}):
            with tracer.start_as_current_span("anthropic.messages.create", attributes={
                    "gen_ai.operation.name": "chat", "gen_ai.response.id": f"msg_{n}"}):
                pass
    provider.shutdown()
    assert main(["detect", "--json", "--all", str(path)]) == 0
    verdicts = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [(v["turns"], v["tool_calls"]) for v in verdicts] == [(2, 1)]
