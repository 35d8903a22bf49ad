"""The runtime's metrics: GenAI client histograms, and counters for runs, tools, anomalies and cost.

Only the OpenTelemetry metrics API is used here; the application (or `setup.configure`) decides where the numbers go.
With no SDK configured every instrument is a no-op, so the loop can call these methods unconditionally.

Names as Prometheus shows them, identical from this module's `prometheus_reader` and from the collector's `prometheus`
exporter (both apply the OpenTelemetry-to-Prometheus rules: dots become underscores, a known unit becomes a suffix, a
`{annotation}` unit adds nothing, counters end in `_total`):

    gen_ai.client.token.usage         {token}    gen_ai_client_token_usage_bucket|_sum|_count
    gen_ai.client.operation.duration  s          gen_ai_client_operation_duration_seconds_bucket|_sum|_count
    looptrace.runs                    {run}      looptrace_runs_total
    looptrace.turns                   {turn}     looptrace_turns_bucket|_sum|_count
    looptrace.tool.calls              {call}     looptrace_tool_calls_total
    looptrace.tool.duration           s          looptrace_tool_duration_seconds_bucket|_sum|_count
    looptrace.anomalies               {anomaly}  looptrace_anomalies_total
    looptrace.cost                    usd        looptrace_cost_usd_total
    looptrace.loop.cost               usd        looptrace_loop_cost_usd_total
    looptrace.approvals               {call}     looptrace_approvals_total
    looptrace.approval.wait           s          looptrace_approval_wait_seconds_bucket|_sum|_count

The cost unit is `usd`, lower case, on purpose. UCUM has no currency, so no spelling is "correct" to OpenTelemetry;
what matters is the Prometheus name. `USD` is not in the unit table, so both exporters append it verbatim and the
series becomes `looptrace_cost_USD_total` (mixed case, easy to mistype in a case-sensitive query language); `{USD}` is
an annotation and is dropped, leaving `looptrace_cost_total`, which hides the currency. `usd` yields
`looptrace_cost_usd_total`, the shape Prometheus' naming guide asks for.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import metrics
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as _gen_ai
from opentelemetry.semconv.attributes import error_attributes as _error
from opentelemetry.semconv.attributes import server_attributes as _server

from . import semconv as sc

# Bucket boundaries the GenAI semantic conventions specify for their two client histograms.
TOKEN_USAGE_BUCKETS: Sequence[float] = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)
OPERATION_DURATION_BUCKETS: Sequence[float] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)
# Ours. Turns: fine-grained where runs usually end, coarse out to the limits people set. Tool calls: from an
# in-process lookup (milliseconds) to a slow subprocess or HTTP call that runs into its timeout (minutes).
TURN_BUCKETS: Sequence[float] = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50, 100)
TOOL_DURATION_BUCKETS: Sequence[float] = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
)
# A decision takes from an approver's milliseconds to a person's days.
APPROVAL_WAIT_BUCKETS: Sequence[float] = (
    0.01, 0.1, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400,
)

# The same attribute names the spans carry, so a metric and its span events can be joined.
ANOMALY_TYPE = sc.ANOMALY_TYPE

_TOKEN_TYPE = _gen_ai.GEN_AI_TOKEN_TYPE
_INPUT = _gen_ai.GenAiTokenTypeValues.INPUT.value
_OUTPUT = _gen_ai.GenAiTokenTypeValues.OUTPUT.value


class LoopMetrics:
    """The instruments the agent loop records into. Create one per agent (or share one); every method is a few
    dictionary entries and an SDK call, safe to call from several threads."""

    def __init__(self, meter_provider: metrics.MeterProvider | None = None) -> None:
        meter = metrics.get_meter(sc.SCOPE_NAME, sc.SCOPE_VERSION, meter_provider=meter_provider)
        # The semconv helpers (create_gen_ai_client_*) take no bucket advice, so the names and units come from the
        # same module but the instruments are created here with the conventions' boundaries.
        self._token_usage = meter.create_histogram(
            sc.METRIC_TOKEN_USAGE,
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=TOKEN_USAGE_BUCKETS,
        )
        self._operation_duration = meter.create_histogram(
            sc.METRIC_OPERATION_DURATION,
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=OPERATION_DURATION_BUCKETS,
        )
        self._runs = meter.create_counter(
            sc.METRIC_RUNS, unit="{run}", description="Agent runs, by agent and by how they ended."
        )
        self._turns = meter.create_histogram(
            sc.METRIC_TURNS,
            unit="{turn}",
            description="Loop iterations (model calls) per run.",
            explicit_bucket_boundaries_advisory=TURN_BUCKETS,
        )
        self._tool_calls = meter.create_counter(
            sc.METRIC_TOOL_CALLS, unit="{call}", description="Tool calls, by tool and outcome."
        )
        self._tool_duration = meter.create_histogram(
            sc.METRIC_TOOL_DURATION,
            unit="s",
            description="Wall-clock time of one tool call, including a timeout.",
            explicit_bucket_boundaries_advisory=TOOL_DURATION_BUCKETS,
        )
        self._anomalies = meter.create_counter(
            sc.METRIC_ANOMALIES, unit="{anomaly}", description="Loop anomalies the detector reported."
        )
        self._cost = meter.create_counter(
            sc.METRIC_COST, unit="usd", description="Estimated spend on model calls, in US dollars."
        )
        self._loop_cost = meter.create_counter(
            sc.METRIC_LOOP_COST, unit="usd",
            description="Estimated spend on the turns of runs that belonged to a loop, in US dollars, by the anomaly "
                        "type that found it.",
        )
        self._approvals = meter.create_counter(
            sc.METRIC_APPROVALS, unit="{call}",
            description="Tool calls that needed approval, by state: pending (the run paused), approved, rejected."
        )
        self._approval_wait = meter.create_histogram(
            sc.METRIC_APPROVAL_WAIT, unit="s", description="Time a call waited for its approval decision.",
            explicit_bucket_boundaries_advisory=APPROVAL_WAIT_BUCKETS,
        )

    def record_chat(
        self,
        *,
        agent: str,
        request_model: str,
        response_model: str | None,
        input_tokens: int,
        output_tokens: int,
        duration_s: float,
        error_type: str | None = None,
        cost_usd: float | None = None,
        server_address: str | None = None,
        server_port: int | None = None,
    ) -> None:
        """One Messages API call. `input_tokens` already includes cache reads and cache writes (the conventions'
        Anthropic rule). A failed call records its duration with `error.type` and no token usage: the API sent none."""
        attributes: dict[str, str | int] = {
            sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
            sc.GEN_AI_PROVIDER_NAME: sc.PROVIDER_ANTHROPIC,
            _gen_ai.GEN_AI_REQUEST_MODEL: request_model,
            # Not one of the conventions' metric attributes, but allowed, and the only way to split spend by agent.
            _gen_ai.GEN_AI_AGENT_NAME: agent,
        }
        if response_model:
            attributes[_gen_ai.GEN_AI_RESPONSE_MODEL] = response_model
        if server_address:
            attributes[_server.SERVER_ADDRESS] = server_address
            if server_port:  # conditionally required beside server.address
                attributes[_server.SERVER_PORT] = server_port

        if error_type is None:
            # Separate dicts rather than one mutated in place: an exemplar reservoir may keep the one it was given.
            self._token_usage.record(input_tokens, {**attributes, _TOKEN_TYPE: _INPUT})
            self._token_usage.record(output_tokens, {**attributes, _TOKEN_TYPE: _OUTPUT})
        else:
            attributes[_error.ERROR_TYPE] = error_type
        self._operation_duration.record(duration_s, attributes)

        if cost_usd is not None:
            self._cost.add(cost_usd, {_gen_ai.GEN_AI_AGENT_NAME: agent, _gen_ai.GEN_AI_REQUEST_MODEL: request_model})

    def record_tool(self, *, agent: str, tool: str, outcome: str, duration_s: float) -> None:
        """One tool call. `outcome` is ok, error, timeout, invalid_arguments or unknown_tool."""
        attributes = {_gen_ai.GEN_AI_AGENT_NAME: agent, _gen_ai.GEN_AI_TOOL_NAME: tool, sc.TOOL_OUTCOME: outcome}
        self._tool_calls.add(1, attributes)
        self._tool_duration.record(duration_s, attributes)

    def record_approval(self, *, agent: str, tool: str, decision: str, by: str | None = None,
                        wait_s: float | None = None) -> None:
        """A call that needed approval: ``decision`` is pending (its run paused), approved or rejected; a decided
        one records how long it waited, and whether the approver or a person decided."""
        attributes = {_gen_ai.GEN_AI_AGENT_NAME: agent, _gen_ai.GEN_AI_TOOL_NAME: tool, sc.TOOL_APPROVAL: decision}
        if by is not None:
            attributes[sc.TOOL_APPROVAL_BY] = by
        self._approvals.add(1, attributes)
        if wait_s is not None:
            self._approval_wait.record(wait_s, attributes)

    def record_run(self, *, agent: str, status: str, turns: int) -> None:
        """The end of a run: its final status (a RunStatus value) and how many turns it took."""
        self._runs.add(1, {_gen_ai.GEN_AI_AGENT_NAME: agent, sc.RUN_STATUS: status})
        self._turns.record(turns, {_gen_ai.GEN_AI_AGENT_NAME: agent})

    def record_loop_cost(self, *, agent: str, type: str, usd: float) -> None:
        """What a run's loops cost, the part first found by anomalies of ``type`` (recorded as the run ends: the
        parts of one run add up to its loop cost, each turn counted once)."""
        if usd > 0:
            self._loop_cost.add(usd, {_gen_ai.GEN_AI_AGENT_NAME: agent, ANOMALY_TYPE: type})

    def record_anomaly(self, *, agent: str, type: str, tool: str | None) -> None:
        """One anomaly from the detector; `tool` is None for anomalies that concern the run rather than one tool."""
        attributes = {_gen_ai.GEN_AI_AGENT_NAME: agent, ANOMALY_TYPE: type}
        if tool:
            attributes[_gen_ai.GEN_AI_TOOL_NAME] = tool
        self._anomalies.add(1, attributes)


def prometheus_reader(port: int, host: str = "127.0.0.1"):
    """A MetricReader that serves its provider's metrics on http://{host}:{port}/metrics for Prometheus to scrape.

    For long-lived services; a CLI run is over before anyone scrapes it and should export over OTLP instead. The reader
    has its own prometheus_client registry, so an application that already uses the global one gets neither duplicate
    nor foreign series, and shutting the reader down (with its MeterProvider) also stops the HTTP server.
    Binds to loopback by default: pass host="0.0.0.0" to let a Prometheus in a container reach it.
    """
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, start_http_server

    class _ServingReader(PrometheusMetricReader):
        def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
            server.shutdown()
            server.server_close()
            super().shutdown(timeout_millis=timeout_millis, **kwargs)

    registry = CollectorRegistry(auto_describe=False)
    reader = _ServingReader(registry=registry)
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise OSError(
            f"cannot serve Prometheus metrics on {host}:{port} ({exc.strerror or exc}); "
            "choose another port with prometheus_port= or LOOPTRACE_PROMETHEUS_PORT"
        ) from exc
    return reader
