"""The local stack's configuration, checked without Docker.

- docker-compose.yml against the Compose specification (check-jsonschema), its depends_on targets, mounted files,
  pinned images and the Langfuse development keys;
- the collector config: pipelines name only components it defines, through ports compose publishes;
- the scale-out collector config (loadbalancing.yaml): by session id where a span carries one, else by trace id,
  with only the options its components document;
- Prometheus: `promtool check config`, `promtool check rules`, `promtool test rules`;
- every PromQL expression of the alerts and the Grafana dashboard: valid (promtool, as recording rules) and naming
  only metrics that exist, checked against a real scrape of the runtime's Prometheus endpoint.

check-jsonschema and promtool are external binaries; their tests skip, saying so, only when the binary is absent.
"""

from __future__ import annotations

import argparse
import base64
import inspect
import itertools
import json
import re
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from looptrace.instrumentation.offline.readers import SESSION_KEYS

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
COLLECTOR = ROOT / "dashboards/otel-collector/config.yaml"
PROMETHEUS = ROOT / "dashboards/prometheus/prometheus.yml"
ALERTS = ROOT / "dashboards/prometheus/alerts.yml"
ALERT_TESTS = ROOT / "dashboards/prometheus/alerts_test.yml"
DASHBOARD = ROOT / "dashboards/grafana/looptrace.json"
STACK_GUIDE = ROOT / "docs" / "stack.md"

# What the collector's spanmetrics connector emits with the namespace and unit dashboards/otel-collector/config.yaml
# sets (traces.span.metrics, seconds), as its prometheus exporter names them.
SPANMETRICS_NAMES = {
    "traces_span_metrics_calls_total",
    "traces_span_metrics_duration_seconds_bucket",
    "traces_span_metrics_duration_seconds_sum",
    "traces_span_metrics_duration_seconds_count",
}
# Their labels: the connector's default dimensions, the ones the config adds, and the histogram's `le`.
SPANMETRICS_LABELS = {"service_name", "span_name", "span_kind", "status_code", "gen_ai_operation_name",
                      "gen_ai_agent_name", "gen_ai_request_model", "gen_ai_tool_name", "le"}


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def compose():
    return load_yaml(COMPOSE)


@pytest.fixture(scope="module")
def collector():
    return load_yaml(COLLECTOR)


def tool(name: str) -> str:
    """Path of an external binary, looked up on PATH and beside this interpreter (a virtualenv's bin/)."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not found:
        hint = {"promtool": "apt-get install prometheus", "check-jsonschema": "pip install check-jsonschema"}[name]
        pytest.skip(f"{name} is not installed ({hint}); CI installs it")
    return found


def run(*args: str, cwd: Path = ROOT) -> str:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{output}"
    return output


# --- docker-compose.yml -------------------------------------------------------------------------------------------


def test_compose_file_follows_the_compose_specification():
    run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE))


def test_every_depends_on_target_is_a_service_and_waits_for_a_healthcheck_it_has(compose):
    services = compose["services"]
    for name, service in services.items():
        for target, condition in (service.get("depends_on") or {}).items():
            assert target in services, f"{name} depends on {target}, which is not a service"
            assert condition["condition"] in {"service_started", "service_healthy", "service_completed_successfully"}
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target} to be healthy; it has no check"


def test_every_mounted_file_exists(compose):
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).is_file(), f"{name} mounts {source}, which does not exist"
            else:
                assert source in compose["volumes"], f"{name} uses volume {source}, which is not declared"


def test_every_image_is_pinned_to_a_version(compose):
    for name, service in compose["services"].items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest" and re.search(r"\d", tag), f"{name}: {image} is not pinned to a version"


def test_every_service_but_the_distroless_collector_has_a_healthcheck(compose):
    without = {name for name, service in compose["services"].items() if "healthcheck" not in service}
    assert without == {"otel-collector"}


def published_ports(service) -> dict[int, int]:
    """{container port: host port} of a compose service's `ports` in the short syntax."""
    ports = {}
    for entry in service.get("ports", []):
        *host, container = str(entry).split(":")
        ports[int(container.split("/")[0])] = int(host[-1])
    return ports


def test_langfuse_is_initialised_with_the_development_keys_the_collector_uses(compose):
    web = compose["services"]["langfuse-web"]["environment"]
    for variable in ("ORG_ID", "PROJECT_ID", "PROJECT_PUBLIC_KEY", "PROJECT_SECRET_KEY", "USER_EMAIL", "USER_PASSWORD"):
        assert web.get(f"LANGFUSE_INIT_{variable}"), f"LANGFUSE_INIT_{variable} is not set"
    public, secret = web["LANGFUSE_INIT_PROJECT_PUBLIC_KEY"], web["LANGFUSE_INIT_PROJECT_SECRET_KEY"]
    assert public.startswith("pk-lf-") and secret.startswith("sk-lf-")

    basic = compose["services"]["otel-collector"]["environment"]["LANGFUSE_BASIC_AUTH"]
    assert base64.b64decode(basic).decode() == f"{public}:{secret}"


def documented_langfuse_values(text: str) -> dict[str, set[str]]:
    values: dict[str, set[str]] = {}
    for name, value in re.findall(r"\b(LANGFUSE_(?:PUBLIC_KEY|SECRET_KEY|BASE_URL|HOST))=[\"']?([^\s\"'`]+)", text):
        values.setdefault(name, set()).add(value)
    return values


def full_stack_text() -> str:
    """docs/stack.md's "Full stack" section: the one place a new user learns URLs, ports and credentials."""
    match = re.search(r"^(#+) Full stack\b.*?(?=^\1 |\Z)", STACK_GUIDE.read_text(), re.M | re.S)
    assert match, "docs/stack.md has no Full stack section"
    return match.group(0)


def test_the_documented_langfuse_credentials_are_the_ones_compose_creates(compose):
    web = compose["services"]["langfuse-web"]["environment"]
    host_port = published_ports(compose["services"]["langfuse-web"])[3000]
    expected = {
        "LANGFUSE_PUBLIC_KEY": {web["LANGFUSE_INIT_PROJECT_PUBLIC_KEY"]},
        "LANGFUSE_SECRET_KEY": {web["LANGFUSE_INIT_PROJECT_SECRET_KEY"]},
        "LANGFUSE_BASE_URL": {f"http://localhost:{host_port}"},
    }
    text = full_stack_text()
    documented = documented_langfuse_values(text)
    for name, values in expected.items():
        assert documented.get(name) == values, f"docs/stack.md gives {name}={documented.get(name)}, not {values}"
    assert web["LANGFUSE_INIT_USER_EMAIL"] in text and web["LANGFUSE_INIT_USER_PASSWORD"] in text


def test_the_full_stack_guide_lists_every_published_port(compose):
    text = full_stack_text()
    for name, service in compose["services"].items():
        for host_port in published_ports(service).values():
            assert re.search(rf"\b{host_port}\b", text), f"docs/stack.md does not mention port {host_port} ({name})"


# --- the collector ------------------------------------------------------------------------------------------------


def component_type(component_id: str) -> str:
    return component_id.split("/")[0]


def assert_pipelines_use_only_components_defined(config) -> None:
    """Every pipeline names only components the config defines, each connector ends one pipeline and starts another,
    nothing defined is left out, and memory_limiter comes first wherever there are processors."""
    defined = {kind: set(config.get(kind) or {}) for kind in ("receivers", "processors", "exporters", "connectors")}
    connectors = defined["connectors"]
    fed, read, processed = set(), set(), set()
    for name, pipeline in config["service"]["pipelines"].items():
        for receiver in pipeline["receivers"]:
            assert receiver in defined["receivers"] | connectors, f"pipeline {name}: receiver {receiver} undefined"
            read.add(receiver)
        for processor in pipeline.get("processors", []):
            assert processor in defined["processors"], f"pipeline {name}: processor {processor} undefined"
            processed.add(processor)
        for exporter in pipeline["exporters"]:
            assert exporter in defined["exporters"] | connectors, f"pipeline {name}: exporter {exporter} undefined"
            fed.add(exporter)
        if pipeline.get("processors"):
            assert pipeline["processors"][0] == "memory_limiter", f"pipeline {name}: memory_limiter must come first"
    for connector in connectors:
        assert connector in fed and connector in read, f"connector {connector} must end one pipeline and start another"
    unused = (set().union(*defined.values())) - (read | fed | processed)
    assert not unused, f"defined but in no pipeline: {unused}"


def test_collector_pipelines_use_only_components_the_config_defines(collector):
    assert_pipelines_use_only_components_defined(collector)
    assert set(collector["service"]["extensions"]) == set(collector["extensions"])


def test_collector_pipelines_carry_traces_to_langfuse_spanmetrics_and_debug_and_metrics_to_prometheus(collector):
    pipelines = collector["service"]["pipelines"]
    traces = next(p for name, p in pipelines.items() if component_type(name) == "traces")
    metrics = next(p for name, p in pipelines.items() if component_type(name) == "metrics")
    assert {component_type(e) for e in traces["exporters"]} == {"otlp_http", "spanmetrics", "debug"}
    assert "batch" in traces["processors"] and "batch" in metrics["processors"]
    assert {component_type(r) for r in metrics["receivers"]} == {"otlp", "spanmetrics"}
    assert [component_type(e) for e in metrics["exporters"]] == ["prometheus"]


def listening_ports(collector) -> set[int]:
    endpoints = [protocol["endpoint"] for protocol in collector["receivers"]["otlp"]["protocols"].values()]
    endpoints += [extension["endpoint"] for extension in collector["extensions"].values()]
    endpoints += [exporter["endpoint"] for name, exporter in collector["exporters"].items()
                  if component_type(name) == "prometheus"]
    for endpoint in endpoints:
        assert endpoint.startswith("0.0.0.0:"), f"{endpoint}: inside a container, listen on all interfaces"
    return {int(endpoint.rsplit(":", 1)[1]) for endpoint in endpoints}


def test_collector_listens_on_the_ports_compose_publishes(collector, compose):
    ports = listening_ports(collector)
    assert {4317, 4318} <= ports
    assert set(published_ports(compose["services"]["otel-collector"])) == ports


def test_collector_sends_to_langfuse_with_basic_auth_and_the_v4_ingestion_header(collector, compose):
    langfuse = collector["exporters"]["otlp_http/langfuse"]
    match = re.fullmatch(r"http://([\w-]+):(\d+)/api/public/otel", langfuse["endpoint"])
    assert match, langfuse["endpoint"]
    host, port = match.group(1), int(match.group(2))
    assert host in compose["services"] and port in published_ports(compose["services"][host])
    headers = langfuse["headers"]
    assert headers["x-langfuse-ingestion-version"] == "4"
    assert headers["Authorization"] == "Basic ${env:LANGFUSE_BASIC_AUTH}"


def test_every_environment_variable_the_collector_reads_is_set_by_compose(compose):
    wanted = set(re.findall(r"\$\{env:(\w+)\}", COLLECTOR.read_text()))
    assert wanted <= set(compose["services"]["otel-collector"]["environment"])


def test_the_config_compose_mounts_is_the_one_the_collector_is_told_to_read(compose):
    service = compose["services"]["otel-collector"]
    mounted = {v.split(":")[1] for v in service["volumes"] if v.startswith("./dashboards/otel-collector/config.yaml:")}
    assert service["command"] == [f"--config={path}" for path in mounted]


def test_prometheus_scrapes_the_collectors_prometheus_exporter(collector, compose):
    config = load_yaml(PROMETHEUS)
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    (exporter,) = [e for name, e in collector["exporters"].items() if component_type(name) == "prometheus"]
    port = exporter["endpoint"].rsplit(":", 1)[1]
    assert f"otel-collector:{port}" in targets
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./dashboards/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in mounts
    assert config["rule_files"] == ["alerts.yml"]


# --- Prometheus rules -----------------------------------------------------------------------------------------------


def test_promtool_accepts_the_prometheus_config():
    run(tool("promtool"), "check", "config", str(PROMETHEUS))


def test_promtool_accepts_the_alert_rules():
    run(tool("promtool"), "check", "rules", str(ALERTS))


def test_alert_rules_pass_their_unit_tests():
    output = run(tool("promtool"), "test", "rules", ALERT_TESTS.name, cwd=ALERT_TESTS.parent)
    assert "SUCCESS" in output


def test_every_alert_is_unit_tested_and_explains_itself():
    rules = [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]
    alerts = {rule["alert"]: rule for rule in rules if "alert" in rule}
    tested = {case["alertname"] for test in load_yaml(ALERT_TESTS)["tests"] for case in test["alert_rule_test"]
              if case["exp_alerts"]}
    assert set(alerts) == tested, f"alerts never shown firing in {ALERT_TESTS.name}: {set(alerts) - tested}"
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"] and len(rule["annotations"]["description"]) > 100, name


# --- PromQL of the dashboard and the alerts --------------------------------------------------------------------------

GRAFANA_RANGES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}


def grafana_to_promql(expr: str) -> str:
    """A panel query as Prometheus would receive it: Grafana's range variables and the dashboard's variables filled."""
    for variable, value in GRAFANA_RANGES.items():
        expr = expr.replace(variable, value)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)  # $agent, $model: only ever used inside =~ matchers


def dashboard_queries() -> dict[str, str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return {f"panel_{panel['id']}_{target['refId']}": grafana_to_promql(target["expr"])
            for panel in dashboard["panels"] for target in panel.get("targets", [])}


def alert_queries() -> dict[str, str]:
    return {rule.get("alert") or rule["record"]: rule["expr"]
            for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]}


PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions, keywords or label names."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # label lists
    expr = re.sub(r"\boffset\s+-?\w+", "", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.])[a-zA-Z_:][\w:]*", expr):
        if match.group() in PROMQL_WORDS or expr[match.end():].lstrip().startswith("("):
            continue  # a keyword, or a function or aggregation being called
        names.add(match.group())
    return names


def test_metric_names_are_found_in_promql():
    expr = ('histogram_quantile(0.95, sum by (le, model) (rate(x_bucket{a=~"b|c"}[5m]))) / on(job) '
            'group_left(team) y_total offset 1h > 1e6 and z unless sum without (i) (w{q="v"})')
    assert metric_names(expr) == {"x_bucket", "y_total", "z", "w"}


def test_every_dashboard_query_is_valid_promql(tmp_path):
    queries = dashboard_queries()
    assert len(queries) >= 10
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:{key}", "expr": expr} for key, expr in queries.items()]}]}
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    run(tool("promtool"), "check", "rules", str(path))


def test_the_dashboard_has_the_panels_and_variables_it_promises():
    dashboard = json.loads(DASHBOARD.read_text())
    titles = {panel["title"] for panel in dashboard["panels"]}
    for title in ("Runs by status", "Turns per run", "Tokens by model and type", "Cost by model",
                  "Model latency p50 / p95", "Tool calls by tool and outcome", "Tool error ratio by tool",
                  "Anomalies by type"):
        assert title in titles
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"agent", "model"}
    datasources = {json.dumps(p.get("datasource"), sort_keys=True) for p in dashboard["panels"] if p["type"] != "row"}
    assert datasources == {json.dumps({"type": "prometheus", "uid": "prometheus"}, sort_keys=True)}
    provisioned = load_yaml(ROOT / "dashboards/grafana/provisioning/datasources/prometheus.yml")["datasources"]
    assert [d["uid"] for d in provisioned] == ["prometheus"]


# --- metric names against a real scrape ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scripted_agent_run(provider) -> bool:
    """A scripted run through the real loop, if the Agent records metrics; False when it cannot (yet)."""
    try:
        from looptrace.runtime import Agent, ScriptedModel
        from looptrace.runtime import tool as as_tool
    except ImportError:
        return False
    if "meter_provider" not in inspect.signature(Agent).parameters:
        return False

    @as_tool
    def search(query: str) -> str:
        """Search the catalogue.

        Args:
            query: what to look for.
        """
        return f"3 results for {query}"

    # The same search three turns running, the same result each time: a loop, so its cost is exported too.
    usage = {"input_tokens": 1200, "output_tokens": 40, "cache_read_input_tokens": 800}
    model = ScriptedModel([
        *({"content": [{"type": "tool_use", "id": f"toolu_{n}", "name": "search", "input": {"query": "osaka"}}],
           "stop_reason": "tool_use", "usage": usage} for n in range(3)),
        {"content": [{"type": "text", "text": "Found 3."}], "stop_reason": "end_turn", "usage": usage},
    ])
    result = Agent("claude-sonnet-4-5", tools=[search], client=model, name="scrape-check", meter_provider=provider,
                   on_anomaly="warn").run("hi")
    assert [a.type for a in result.anomalies] == ["repeated_call"]
    return True


@pytest.fixture(scope="module")
def scrape_text() -> str:
    """What the runtime's own Prometheus endpoint serves after a looping run and every kind of event, and what
    `looptrace watch` serves."""
    from opentelemetry.sdk.metrics import MeterProvider

    from looptrace.instrumentation.recording.metrics import LoopMetrics, prometheus_reader

    port = free_port()
    provider = MeterProvider(metric_readers=[prometheus_reader(port)])
    try:
        scripted_agent_run(provider)
        # Whatever a short happy run does not produce: a failed call, a failing tool, an anomaly, a run on a limit.
        loop_metrics = LoopMetrics(meter_provider=provider)
        loop_metrics.record_chat(agent="support", request_model="claude-sonnet-4-5",
                                 response_model="claude-sonnet-4-5-20250929", input_tokens=2000, output_tokens=150,
                                 duration_s=3.2, cost_usd=0.0083, server_address="api.anthropic.com")
        loop_metrics.record_chat(agent="support", request_model="claude-sonnet-4-5", response_model=None,
                                 input_tokens=0, output_tokens=0, duration_s=60.0, error_type="APITimeoutError")
        loop_metrics.record_tool(agent="support", tool="search", outcome="ok", duration_s=0.12)
        loop_metrics.record_tool(agent="support", tool="search", outcome="timeout", duration_s=30.0)
        loop_metrics.record_anomaly(agent="support", type="repeated_call", tool="search")
        loop_metrics.record_run(agent="support", status="max_turns", turns=10)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        provider.shutdown()
    return body + "\n" + watch_metrics_text()


@pytest.fixture(scope="module")
def scraped(scrape_text) -> dict[str, set[str]]:
    """{metric name: label names} from the scrape."""
    series: dict[str, set[str]] = {}
    for line in scrape_text.splitlines():
        match = re.match(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? ", line)
        if match and not line.startswith("#"):
            labels = set(re.findall(r"(\w+)=\"", match.group(2) or ""))
            series.setdefault(match.group(1), set()).update(labels)
    return series


def watch_metrics_text() -> str:
    """What `looptrace watch` serves on /metrics once every series it has was touched."""
    from looptrace.instrumentation.watch import WatchMetrics

    metrics = WatchMetrics()
    metrics.anomalies.labels(service="shop", agent="support", anomaly_type="repeated_call").inc()
    metrics.spans_received.inc()
    metrics.spans_rejected.labels(reason="overloaded").inc()
    metrics.requests.labels(transport="http", outcome="ok").inc()
    metrics.runs_evicted.inc()
    metrics.runs_judged.labels(reason="root").inc()
    return metrics.render().decode()


def test_the_runtime_endpoint_shows_every_metric_under_its_documented_name(scraped):
    for name in ("gen_ai_client_token_usage_bucket", "gen_ai_client_operation_duration_seconds_bucket",
                 "looptrace_runs_total", "looptrace_turns_bucket", "looptrace_tool_calls_total",
                 "looptrace_tool_duration_seconds_bucket", "looptrace_anomalies_total", "looptrace_cost_usd_total"):
        assert name in scraped, f"{name} not in the scrape: {sorted(scraped)}"
    token_labels = scraped["gen_ai_client_token_usage_bucket"]
    assert {"gen_ai_token_type", "gen_ai_request_model", "gen_ai_agent_name"} <= token_labels
    assert "error_type" in scraped["gen_ai_client_operation_duration_seconds_bucket"]
    assert {"gen_ai_agent_name", "looptrace_run_status"} <= scraped["looptrace_runs_total"]
    assert {"gen_ai_tool_name", "looptrace_tool_outcome"} <= scraped["looptrace_tool_calls_total"]
    assert {"looptrace_anomaly_type", "gen_ai_tool_name"} <= scraped["looptrace_anomalies_total"]


LOOP_COST = "looptrace_loop_cost_usd_total"


def test_the_loop_cost_panel_and_alert_work_on_the_series_a_looping_run_exports(scrape_text, tmp_path):
    """The series a looping run really exported, with its name and labels, replayed to promtool growing $0.125 a
    minute (a value floats hold exactly: promtool compares samples exactly): the dashboard panel's query and the
    alert's recording rule give their sums, and the alert fires."""
    [(labels, value)] = [(m.group(1), float(m.group(2))) for m in
                         re.finditer(rf"^{LOOP_COST}\{{(.*)\}} (\S+)$", scrape_text, re.MULTILINE)]
    # 3 turns of 1,200 input, 800 cache-read and 40 output tokens at claude-sonnet-4-5's $3 / $0.30 / $15 a million
    assert value == pytest.approx(3 * (1200 * 3 + 800 * 0.3 + 40 * 15) / 1e6)
    assert 'looptrace_anomaly_type="repeated_call"' in labels and 'gen_ai_agent_name="scrape-check"' in labels
    per_minute = 0.125
    [panel] = [grafana_to_promql(t["expr"]) for p in json.loads(DASHBOARD.read_text())["panels"]
               if p["title"] == "Loop cost by anomaly type" for t in p["targets"]]
    tests = {"rule_files": [str(ALERTS)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": f'{LOOP_COST}{{{labels},job="looptrace",instance="svc"}}',
                          "values": f"0+{per_minute!r}x80"}],
        "promql_expr_test": [
            {"expr": panel, "eval_time": "30m",
             "exp_samples": [{"labels": '{looptrace_anomaly_type="repeated_call"}', "value": per_minute}]},
            {"expr": "agent:looptrace_loop_cost_usd:increase1h", "eval_time": "70m",
             "exp_samples": [{"labels": 'agent:looptrace_loop_cost_usd:increase1h{gen_ai_agent_name="scrape-check"}',
                              "value": 60 * per_minute}]},
            {"expr": 'ALERTS{alertname="LooptraceLoopCostHigh"}', "eval_time": "70m",
             "exp_samples": [{"labels": 'ALERTS{alertname="LooptraceLoopCostHigh", alertstate="firing", '
                                        'gen_ai_agent_name="scrape-check", severity="critical"}', "value": 1}]},
        ],
    }]}
    assert 60 * per_minute > 5  # the threshold the alert is for
    path = tmp_path / "loop_cost_test.yml"
    path.write_text(yaml.safe_dump(tests))
    run(tool("promtool"), "test", "rules", str(path))


def recording_rule_names() -> set[str]:
    return {rule["record"] for group in load_yaml(ALERTS)["groups"] for rule in group["rules"] if "record" in rule}


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_promql_names_only_metrics_that_exist(source, scraped):
    queries = dashboard_queries() if source == "dashboard" else alert_queries()
    known = set(scraped) | SPANMETRICS_NAMES | recording_rule_names()
    for key, expr in queries.items():
        unknown = metric_names(expr) - known
        assert not unknown, f"{source} {key} names metrics nothing emits: {unknown}"


def test_promql_uses_only_labels_the_metrics_carry(scraped):
    """A misspelt label does not break a query, it silently matches nothing; so label names are checked too."""
    labels_of = {**{name: SPANMETRICS_LABELS for name in SPANMETRICS_NAMES}, **scraped}
    every_label = set().union(*labels_of.values())
    for key, expr in {**dashboard_queries(), **alert_queries()}.items():
        selected = [labels_of[name] for name in metric_names(expr) if name in labels_of]
        carried = set().union(*selected) if selected else every_label  # a rule over recording rules: any label
        used = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"", expr))
        used |= {label.strip() for group in re.findall(r"\bby\s*\(([^)]*)\)", expr) for label in group.split(",")}
        assert used <= carried | {"job", "instance"}, f"{key} uses labels its metrics do not carry: {used - carried}"


# --- the collector names metrics as the runtime's endpoint does ------------------------------------------------------

UNIT_WORDS = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": ""}  # the entries our instruments need


def collector_prometheus_name(name: str, unit: str, monotonic_counter: bool) -> str:
    """The name the collector's prometheus exporter gives a metric under its default translation strategy
    (UnderscoreEscapingWithSuffixes, prometheus/otlptranslator): dots and other invalid characters split the name into
    words; a unit in braces adds nothing, a known unit adds its word, any other unit is appended as written; counters
    get _total."""
    words = [w for w in re.split(r"[^a-zA-Z0-9:]+", name) if w]
    main = unit.split("/")[0].strip()
    if main and not re.search(r"[{}]", main):
        suffix = UNIT_WORDS.get(main, main)
        if suffix and suffix not in words:
            words.append(suffix)
    if monotonic_counter:
        words = [w for w in words if w != "total"] + ["total"]
    return "_".join(words)


def test_the_collector_would_name_every_instrument_as_the_runtime_endpoint_does(scraped):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from looptrace.instrumentation.recording.metrics import LoopMetrics

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    loop_metrics = LoopMetrics(meter_provider=provider)
    loop_metrics.record_chat(agent="a", request_model="m", response_model=None, input_tokens=1, output_tokens=1,
                             duration_s=0.1, cost_usd=0.1)
    loop_metrics.record_tool(agent="a", tool="t", outcome="ok", duration_s=0.1)
    loop_metrics.record_run(agent="a", status="done", turns=1)
    loop_metrics.record_anomaly(agent="a", type="cycle", tool=None)
    metrics = [m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
    provider.shutdown()
    assert len(metrics) == 8

    for metric in metrics:
        counter = getattr(metric.data, "is_monotonic", False)
        name = collector_prometheus_name(metric.name, metric.unit, counter)
        exposed = name if counter else f"{name}_bucket"
        assert exposed in scraped, f"{metric.name} ({metric.unit}): collector says {exposed}, runtime says otherwise"


# --- looptrace watch in the stack ------------------------------------------------------------------------------------

LOADBALANCING = ROOT / "dashboards/otel-collector/loadbalancing.yaml"
WATCH_DOCKERFILE = ROOT / "dashboards/watch/Dockerfile"


def watch_args(compose) -> argparse.Namespace:
    """The flags compose starts watch with, parsed by the real CLI (an unknown flag fails here, not in the stack)."""
    from looptrace.cli.app import build_parser

    entrypoint = re.search(r"ENTRYPOINT \[(.*)\]", WATCH_DOCKERFILE.read_text()).group(1)
    argv = json.loads(f"[{entrypoint}]")[1:] + compose["services"]["looptrace-watch"]["command"]
    return build_parser().parse_args(argv)


def test_watch_is_built_from_this_repository_and_listens_inside_the_network_only(compose):
    service = compose["services"]["looptrace-watch"]
    assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).resolve() == WATCH_DOCKERFILE
    assert "ports" not in service  # reached through the collector; nothing on the host
    args = watch_args(compose)
    assert args.handler.__name__ == "_watch" and args.host == "0.0.0.0"
    assert args.port == 4318 and args.grpc_port == 4317


def test_the_watch_image_is_tagged_with_the_package_version(compose):
    """compose reuses an image it already has under the same tag: a tag left behind by a release would keep running
    the old watch after an upgrade."""
    from looptrace import __version__

    image = compose["services"]["looptrace-watch"]["image"]
    assert image == f"looptrace-watch:{__version__}"


def test_the_collector_fans_traces_out_to_langfuse_and_watch_with_watchs_token(collector, compose):
    (traces,) = [p for name, p in collector["service"]["pipelines"].items() if component_type(name) == "traces"]
    assert {"otlp_http/langfuse", "otlp_http/watch"} <= set(traces["exporters"])
    exporter = collector["exporters"]["otlp_http/watch"]
    assert exporter["endpoint"] == f"http://looptrace-watch:{watch_args(compose).port}"
    assert exporter["headers"]["Authorization"] == "Bearer ${env:LOOPTRACE_WATCH_TOKEN}"
    assert exporter.get("compression") in (None, "gzip", "none")  # what watch can decompress
    token = compose["services"]["looptrace-watch"]["environment"]["LOOPTRACE_WATCH_TOKEN"]
    assert compose["services"]["otel-collector"]["environment"]["LOOPTRACE_WATCH_TOKEN"] == token


def test_prometheus_scrapes_watch_under_the_job_name_the_rules_and_board_select(compose):
    config = load_yaml(PROMETHEUS)
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "looptrace-watch"]
    assert job["static_configs"][0]["targets"] == [f"looptrace-watch:{watch_args(compose).port}"]
    watch_queries = {k: q for k, q in {**dashboard_queries(), **alert_queries()}.items() if "looptrace_watch" in q
                     or 'job="looptrace-watch"' in q}
    assert watch_queries
    for key, query in watch_queries.items():
        for job_name in re.findall(r'job!?="([^"]+)"', query):
            assert job_name == "looptrace-watch", key


def test_the_board_and_the_alerts_cover_every_metric_watch_serves():
    served = set(re.findall(r"^# TYPE (\w+) (\w+)", watch_metrics_text(), re.M))
    queried = " ".join([*dashboard_queries().values(), *alert_queries().values()])
    for name, kind in served:
        name = name.removesuffix("_total")
        if name.endswith("_created"):
            continue  # prometheus_client's creation timestamps (the service switches them off)
        if name in ("looptrace_watch_requests", "looptrace_watch_runs_judged", "looptrace_watch_queue_batches"):
            continue  # diagnostic detail, on /metrics for whoever needs it
        family = f"{name}_total" if kind == "counter" else name
        assert family in queried, f"{family} is on watch's /metrics but in no panel or alert"


# --- scale-out: several watch processes behind one collector --------------------------------------------------------
#
# dashboards/otel-collector/loadbalancing.yaml splits spans with the routing connector (span context) and routes each
# part with its own loadbalancing exporter: by session id where a span carries one, by trace id otherwise. The options
# below are the ones those components document (opentelemetry-collector-contrib: the exporter's README and
# trace_exporter.go, the connector's README and traces.go); no collector binary is run here.

# routing_key values, and those that route spans (the others are for metrics and logs).
LOADBALANCING_ROUTING_KEYS = {"traceID", "service", "attributes", "resource", "metric", "streamID"}
LOADBALANCING_SPAN_ROUTING_KEYS = {"traceID", "service", "attributes"}
LOADBALANCING_OPTIONS = {"routing_key", "routing_attributes", "protocol", "resolver", "timeout", "retry_on_failure",
                         "sending_queue"}
LOADBALANCING_RESOLVERS = {"static", "dns", "k8s", "aws_cloud_map"}
DNS_RESOLVER_OPTIONS = {"hostname", "port", "interval", "timeout"}
ROUTING_CONNECTOR_OPTIONS = {"table", "default_pipelines", "error_mode"}
ROUTING_TABLE_OPTIONS = {"context", "condition", "statement", "pipelines"}
ROUTING_CONTEXTS = {"resource", "span", "metric", "datapoint", "log", "request"}
OTTL_ERROR_MODES = {"propagate", "ignore", "silent"}

_ATTRIBUTE_TEST = re.compile(r'attributes\["([^"]+)"\] != (nil|"")')


@pytest.fixture(scope="module")
def scale_out():
    return load_yaml(LOADBALANCING)


def loadbalancers(config) -> dict[str, dict]:
    return {name: exporter for name, exporter in config["exporters"].items()
            if component_type(name) in ("loadbalancing", "load_balancing")}


def session_router(config) -> dict:
    """The routing connector the intake pipeline ends in."""
    (intake,) = [p for p in config["service"]["pipelines"].values() if "otlp" in p["receivers"]]
    (name,) = intake["exporters"]
    assert component_type(name) == "routing"
    return config["connectors"][name]


def span_condition_holds(condition: str, attributes: dict[str, object]) -> bool:
    """A routing condition evaluated as OTTL does, for the one form the config uses: `attributes["K"] != nil` and
    `attributes["K"] != ""` clauses joined by `and` (a missing attribute is nil, which is not ""). Any other form fails
    the test, so a new kind of condition comes with a way to check it."""
    holds = True
    for clause in re.split(r"\s+and\s+", condition.strip()):
        match = _ATTRIBUTE_TEST.fullmatch(clause.strip())
        assert match, f"a condition this test cannot evaluate: {clause!r}"
        key, other = match.groups()
        value = attributes.get(key)
        holds = holds and (value is not None if other == "nil" else value != "")
    return holds


def watch_route(config, trace_id: str, attributes: dict[str, object]) -> str:
    """What the collector hashes to pick a watch process for one span: the first matching route's exporter's key."""
    router = session_router(config)
    matching = [entry["pipelines"] for entry in router["table"] if span_condition_holds(entry["condition"], attributes)]
    (pipeline,) = matching[0] if matching else router["default_pipelines"]
    (exporter,) = config["service"]["pipelines"][pipeline]["exporters"]
    settings = loadbalancers(config)[exporter]
    if settings["routing_key"] == "traceID":
        return f"trace {trace_id}"
    assert settings["routing_key"] == "attributes"
    return "".join(f"{key}={attributes.get(key, '')}|" for key in settings["routing_attributes"])


def test_the_scale_out_config_wires_every_route_to_a_pipeline_of_its_own(scale_out, compose):
    assert_pipelines_use_only_components_defined(scale_out)
    pipelines = scale_out["service"]["pipelines"]
    assert {component_type(name) for name in pipelines} == {"traces"}
    (intake,) = [p for p in pipelines.values() if "otlp" in p["receivers"]]
    assert intake["processors"] == ["memory_limiter"]  # no batch before the load balancer: it batches per backend
    router = session_router(scale_out)
    routed = [entry["pipelines"] for entry in router["table"]] + [router["default_pipelines"]]
    for targets in routed:
        (target,) = targets  # one pipeline each: a span goes to one watch process, never two
        assert target in pipelines and component_type(pipelines[target]["exporters"][0]) == "loadbalancing"
    assert len({name for (name,) in routed}) == len(routed)
    wanted = set(re.findall(r"\$\{env:(\w+)\}", LOADBALANCING.read_text()))
    assert wanted <= set(compose["services"]["otel-collector"]["environment"])
    assert "loadbalancing.yaml" in (ROOT / "dashboards/README.md").read_text()


def test_the_scale_out_config_uses_only_options_its_components_have(scale_out):
    for name, connector in scale_out["connectors"].items():
        assert component_type(name) == "routing"
        assert set(connector) <= ROUTING_CONNECTOR_OPTIONS, name
        assert connector.get("error_mode", "propagate") in OTTL_ERROR_MODES
        for entry in connector["table"]:
            assert set(entry) <= ROUTING_TABLE_OPTIONS and entry.get("context", "resource") in ROUTING_CONTEXTS
            assert ("condition" in entry) != ("statement" in entry), "a route has a condition or a statement"
            assert entry["context"] == "span"  # each span on its own: a resource's spans may belong to many sessions
    for name, exporter in loadbalancers(scale_out).items():
        assert set(exporter) <= LOADBALANCING_OPTIONS, name
        assert exporter["routing_key"] in LOADBALANCING_ROUTING_KEYS & LOADBALANCING_SPAN_ROUTING_KEYS, name
        # routing_attributes is read only with routing_key attributes, and one attribute keeps the key the session's
        if exporter["routing_key"] == "attributes":
            assert len(exporter["routing_attributes"]) == 1, name
        else:
            assert "routing_attributes" not in exporter, name
        assert set(exporter["protocol"]) == {"otlp"}, name  # the exporter's only protocol: OTLP/gRPC
        (resolver,) = exporter["resolver"].items()
        assert resolver[0] in LOADBALANCING_RESOLVERS and set(resolver[1]) <= DNS_RESOLVER_OPTIONS


def test_every_route_reaches_the_same_watch_replicas_on_their_grpc_port_with_the_token(scale_out, compose):
    exporters = list(loadbalancers(scale_out).values())
    assert len(exporters) == len(session_router(scale_out)["table"]) + 1
    for exporter in exporters:
        assert exporter["protocol"] == exporters[0]["protocol"] and exporter["resolver"] == exporters[0]["resolver"]
    protocol = exporters[0]["protocol"]["otlp"]
    assert protocol["headers"]["authorization"] == "Bearer ${env:LOOPTRACE_WATCH_TOKEN}"
    assert protocol.get("compression") in (None, "gzip", "none")  # what watch can decompress
    resolver = exporters[0]["resolver"]["dns"]
    assert resolver["hostname"] in compose["services"]
    assert resolver["port"] == watch_args(compose).grpc_port


@pytest.mark.parametrize("key", SESSION_KEYS)
def test_every_run_of_a_session_goes_to_one_watch_process_whatever_attribute_carries_its_id(scale_out, key):
    # One trace per user message, each with an agent span, a model call and a tool call, all carrying the id.
    runs = [[(f"trace-{message}", {key: "conversation-1", "span": kind}) for kind in ("agent", "chat", "tool")]
            for message in range(3)]
    routes = {watch_route(scale_out, trace_id, attributes) for run in runs for trace_id, attributes in run}
    assert routes == {watch_route(scale_out, "trace-0", {key: "conversation-1"})}
    assert watch_route(scale_out, "trace-0", {key: "conversation-2"}) not in routes


def test_spans_without_a_session_id_go_by_trace_id_so_each_trace_stays_whole(scale_out):
    spans = [("trace-a", {}), ("trace-a", {"http.route": "/v1/messages"}), ("trace-b", {})]
    routes = [watch_route(scale_out, trace_id, attributes) for trace_id, attributes in spans]
    assert routes == ["trace trace-a", "trace trace-a", "trace trace-b"]
    for key in SESSION_KEYS:  # an empty id is no session id, for watch (readers.py) and for the routing alike
        assert watch_route(scale_out, "trace-a", {key: ""}) == "trace trace-a"


def test_a_span_with_several_session_ids_is_routed_by_the_one_watch_keys_its_session_on(scale_out):
    for size in range(1, len(SESSION_KEYS) + 1):
        for keys in itertools.combinations(SESSION_KEYS, size):
            attributes = {key: f"id-from-{key}" for key in keys}
            watchs_choice = next(attributes[key] for key in SESSION_KEYS if attributes.get(key))
            assert watch_route(scale_out, "trace-a", attributes).endswith(f"={watchs_choice}|"), keys
