"""A setting that cannot be used is reported by its variable's name and what it accepts, never with its value (which
may be a token pasted into the wrong variable); a Langfuse key without its pair is said, not silently dropped."""

from __future__ import annotations

import pytest

from looptrace.cli import main

VALUE = "sk-lf-9f8e7d6c5b4a-PASTED-HERE"
LOOPBACK = "http://127.0.0.1:9"  # never reached: each case is refused or warned about first, or nothing listens


def demo(capsys) -> tuple[int, str]:
    code = main(["demo", "--json"])
    out, err = capsys.readouterr()
    return code, out + err


@pytest.mark.parametrize("variable, extra, accepted", [
    ("OTEL_EXPORTER_OTLP_ENDPOINT", {}, "http://host:4318"),
    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", {}, "http://host:4318"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", {"OTEL_EXPORTER_OTLP_ENDPOINT": LOOPBACK}, "http/protobuf or grpc"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", {"OTEL_EXPORTER_OTLP_ENDPOINT": LOOPBACK}, "gzip, deflate or none"),
    ("OTEL_EXPORTER_OTLP_TIMEOUT", {"OTEL_EXPORTER_OTLP_ENDPOINT": LOOPBACK}, "milliseconds"),
    ("LOOPTRACE_CAPTURE_CONTENT", {}, "NO_CONTENT"),
    ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", {}, "NO_CONTENT"),
    ("OTEL_BSP_MAX_QUEUE_SIZE", {}, "positive whole number"),
    ("LANGFUSE_TIMEOUT", {"LANGFUSE_PUBLIC_KEY": "pk-lf-1", "LANGFUSE_SECRET_KEY": "sk-lf-2"}, "seconds"),
    ("OTEL_TRACES_EXPORTER", {}, "otlp, console, none"),
])
def test_a_bad_setting_is_named_with_what_it_takes_never_with_its_value(workdir, capsys, monkeypatch, variable,
                                                                         extra, accepted):
    for name, value in {**extra, variable: VALUE}.items():
        monkeypatch.setenv(name, value)
    code, said = demo(capsys)
    assert variable in said and accepted in said, said[-2000:]
    assert VALUE not in said and VALUE.lower() not in said
    assert "PASTED" not in said.upper()


@pytest.mark.parametrize("given, missing", [("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY"),
                                            ("LANGFUSE_SECRET_KEY", "LANGFUSE_PUBLIC_KEY")])
def test_one_langfuse_key_without_the_other_is_said(workdir, capsys, monkeypatch, given, missing):
    monkeypatch.delenv(missing, raising=False)
    monkeypatch.setenv(given, VALUE)
    code, said = demo(capsys)
    assert code == 0
    assert given in said and missing in said and "Langfuse" in said
    assert VALUE not in said
