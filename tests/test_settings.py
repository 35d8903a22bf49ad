"""One settings object: every variable read in one place, documented in docs/configuration.md, overridable by flags; a malformed
header list is named, never printed."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from fakes.otlp_receiver import unused_port

from looptrace import Settings
from looptrace.instrumentation import settings as settings_module
from looptrace.instrumentation.export.exporters import network_exporter, network_metric_exporter
from looptrace.instrumentation.export.setup import configure
from looptrace.instrumentation.settings import VARIABLES, ConfigurationError, expand

ROOT = Path(__file__).resolve().parent.parent
OURS = ("LOOPTRACE_", "LANGFUSE_", "OTEL_", "TRACEPARENT", "TRACESTATE", "XDG_CACHE_HOME", "XDG_STATE_HOME")


class RecordingEnvironment(dict):
    """An environment that remembers every name looked up."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def get(self, name, default=None):
        self.read.add(name)
        return super().get(name, default)


def documented_variables() -> set[str]:
    table = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    names: set[str] = set()
    for row in table.splitlines():
        if row.startswith("| `"):
            first_cell = row.replace("\\|", "|").split(" | ")[0]
            for name in re.findall(r"`([A-Z][A-Z0-9_\[\]|]+)`", first_cell):
                names.update(expand(name))
    return {n for n in names if n.startswith(OURS)}


def test_the_readme_table_lists_exactly_the_variables_settings_read():
    environment = RecordingEnvironment()
    Settings.from_env(environment)
    read = {n for n in environment.read if n.startswith(OURS)}
    declared = {n for name in VARIABLES for n in expand(name)}
    assert read == declared
    assert documented_variables() == declared


def test_no_other_module_reads_looptraces_variables():
    for path in [*(ROOT / "instrumentation").rglob("*.py"), *(ROOT / "runtime").rglob("*.py")]:  # packages too
        if path.name == "settings.py":
            continue
        source = path.read_text(encoding="utf-8")
        reads = re.findall(r"""(?:environ\.get\(|environ\[|getenv\()\s*["']((?:LOOPTRACE|LANGFUSE|OTEL)_\w*)""", source)
        assert not reads, f"{path.name} reads {reads} itself"


def test_flags_override_fields_and_leave_the_rest():
    base = Settings.from_env({"LOOPTRACE_EXPORTER": "langfuse", "LOOPTRACE_TRACE_FILE": "a.jsonl",
                              "LOOPTRACE_MODEL": "claude-x"})
    assert base.exporters == ("langfuse",) and base.trace_file == Path("a.jsonl")
    flagged = base.with_overrides(exporters="file,console", trace_file=None)
    assert flagged.exporters == ("file", "console") and flagged.trace_file == Path("a.jsonl")
    assert flagged.model == "claude-x"


def test_the_longest_line_read_back_is_a_setting_with_a_floor():
    def limit(value: str | None) -> int:
        return Settings.from_env({} if value is None else {"LOOPTRACE_MAX_LINE_BYTES": value}).max_line_bytes

    assert limit(None) == limit("") == limit("lots") == limit("1e6") == 64 * 1024 * 1024 == Settings().max_line_bytes
    assert limit("-5") == 64 * 1024 * 1024  # no size at all: the default, said (test_first_hour)
    assert limit(" 100000 ") == 100_000 and limit("8MiB") == 8 * 1024 * 1024
    assert limit("10") == 1024  # never so small that a real line cannot be read


def test_the_exporter_choice_follows_the_documented_precedence():
    keys = {"LANGFUSE_PUBLIC_KEY": "pk", "LANGFUSE_SECRET_KEY": "sk"}
    assert Settings.from_env({}).chosen_exporters() == ["file"]
    # The local file stays on beside the backends the environment sets up; an explicit choice is taken exactly.
    assert Settings.from_env(keys).chosen_exporters() == ["file", "langfuse"]
    assert Settings.from_env({**keys, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}).chosen_exporters() == [
        "file", "langfuse", "otlp"]
    assert Settings.from_env({**keys, "OTEL_TRACES_EXPORTER": "console"}).chosen_exporters() == ["console"]
    assert Settings.from_env({"OTEL_TRACES_EXPORTER": "zipkin"}).chosen_exporters() == ["file"]  # not ours to read
    assert Settings.from_env({"LOOPTRACE_EXPORTER": "none"}).chosen_exporters() == []
    assert Settings.from_env({**keys, "OTEL_SDK_DISABLED": "true"}).chosen_exporters() == []
    with pytest.raises(ConfigurationError, match="jaeger"):
        Settings.from_env({"LOOPTRACE_EXPORTER": "jaeger"})


def test_langfuse_environment_and_release_are_read():
    langfuse = Settings.from_env({"LANGFUSE_PUBLIC_KEY": "pk", "LANGFUSE_SECRET_KEY": "sk",
                                  "LANGFUSE_TRACING_ENVIRONMENT": "staging", "LANGFUSE_RELEASE": "v1.2"}).langfuse
    assert langfuse is not None and (langfuse.environment, langfuse.release) == ("staging", "v1.2")


def test_secrets_stay_out_of_the_settings_repr():
    settings = Settings.from_env({"LANGFUSE_PUBLIC_KEY": "pk-lf-1", "LANGFUSE_SECRET_KEY": "sk-lf-2",
                                  "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20tok-3",
                                  "LOOPTRACE_ALERT_WEBHOOK": "https://hooks.example/T0/secret-4"})
    shown = repr(settings)
    for secret in ("pk-lf-1", "sk-lf-2", "tok-3", "secret-4"):
        assert secret not in shown


MALFORMED = "Authorization: Bearer sk-live-123"


def test_a_malformed_header_list_is_named_never_printed_when_only_langfuse_is_used(monkeypatch, caplog, capsys):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", MALFORMED)
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk")
    # A local port nothing listens on: without a base URL this would be Langfuse Cloud, and no test leaves the machine.
    monkeypatch.setenv("LANGFUSE_BASE_URL", f"http://127.0.0.1:{unused_port()}")
    monkeypatch.delenv("LANGFUSE_HOST", raising=False)
    caplog.set_level(logging.DEBUG)
    settings = Settings.from_env()
    for _ in range(5):  # what a run builds: each exporter parsed the variable again and warned with its value
        network_exporter("langfuse", settings).shutdown()
    telemetry = configure(settings, exporters="langfuse", set_global=False)
    telemetry.shutdown(100)
    captured = capsys.readouterr()
    everything = captured.out + captured.err + caplog.text
    assert "sk-live-123" not in everything and "Header format invalid" not in everything


def test_a_malformed_header_list_stops_the_otlp_exporter_naming_the_variable(monkeypatch, capsys):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", MALFORMED)
    settings = Settings.from_env()
    with pytest.raises(ConfigurationError) as raised:
        network_exporter("otlp", settings)
    assert "OTEL_EXPORTER_OTLP_TRACES_HEADERS" in str(raised.value)
    assert "sk-live-123" not in str(raised.value) and "Bearer" not in str(raised.value).split("e.g.")[0]
    network_metric_exporter(settings).shutdown()  # the metrics variant is not malformed: it still works


def test_the_cli_reports_a_malformed_header_list_in_one_line(monkeypatch, tmp_path, capsys):
    from looptrace.cli.app import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", MALFORMED)
    assert main(["demo", "--exporter", "otlp", "--json"]) == 2
    err = capsys.readouterr().err
    assert "OTEL_EXPORTER_OTLP_HEADERS is malformed" in err and "sk-live-123" not in err


def test_well_formed_headers_are_url_decoded():
    headers, malformed = settings_module.parse_headers("Authorization=Bearer%20abc, x-team = agents")
    assert headers == {"authorization": "Bearer abc", "x-team": "agents"} and malformed == 0
