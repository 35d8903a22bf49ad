"""Benchmark 10's in-process variant set: every variant in one process, interleaved, the order rotating every repetition.

The separate-process table (``b10_peers``) gives each variant a process of its own, the peers pinned in venvs of their
own. This set answers the question a user asks when choosing: in *one* process, with current releases, what does each
way of recording the same conversation cost per turn? The conversation is benchmark 10's (3 calls through the real
``anthropic`` SDK against the fake Messages API, 2 tool calls then ``end_turn``), and so is the clock (process CPU,
all threads, each sample ending with the variant's flush), over the same bare loop in the same repetition.

Variants:

* ``looptrace-file``: an ``Agent`` given no provider (a pipeline of its own: the SDK's provider, the trace file).
* ``raw-file``: the file's floor *with content*: the spans of a real looptrace run of the conversation (input and
  output messages, system instructions, tool definitions, every attribute) made again through the SDK's tracer, each
  span encoded by the SDK's own OTLP/JSON encoder (``opentelemetry-exporter-otlp-json-common``) and appended to a file
  as it ends (one line per span, as looptrace writes it). Each span is made where a loop instrumented by hand would
  make it (``replay.Replayer``): a chat span around each request, a tool span around each tool call.
* ``looptrace-otlp``: ``configure(exporters="otlp")`` to the local OTLP sink (what Langfuse and collector users run).
* both looptrace rows with no per-tool time limit (``Limits(tool_timeout_s=None)``), as the bare loop and the floors
  run the tool: on the loop's thread, for as long as it takes. ``looptrace-file-timed`` and ``looptrace-otlp-timed``
  are the same with the Agent's default limit of 60 s, which puts each sync call on a tool thread the run can leave
  behind (two thread switches a call): the price of that limit, beside the rows the goals divide.
* ``raw-otlp``: the OTLP floor *with content*: the same recorded spans, made the same way, through a
  ``BatchSpanProcessor`` and the SDK's OTLP/HTTP exporter to the same sink.
* ``raw-file-burst`` and ``raw-otlp-burst``: the same two with every span made after the conversation, in one burst
  (the floor before issue 29's last round). A reference only: no instrumentation can make its spans after the calls
  they time, and the burst runs the SDK's code and the recorded values warm in the cache, which the interleaved
  floor, like looptrace and every peer, does not.
* the peers that can share a process, each instrumenting the anthropic SDK only around its own samples
  (``instrument()`` before, ``uninstrument()`` after, outside the clock), exporting through a BatchSpanProcessor and
  the OTLP/HTTP exporter to the sink: OpenLLMetry (``opentelemetry-instrumentation-anthropic``) and OpenInference
  (``openinference-instrumentation-anthropic``) where importable.

``LOOPTRACE_BENCH_INPROCESS_GOALS_ONLY=1`` keeps only the variants the goals divide (the bare loop, both looptrace
paths and both floors), so that ``LOOPTRACE_BENCH_INPROCESS_REPS`` can be raised for the same time.

Run as ``python -m benchmarks.b10_inprocess`` by ``b10_peers`` (in a venv with OpenLLMetry's current release when one
could be made, else in this environment); it prints one JSON line: each variant's samples and versions.
"""

from __future__ import annotations

import gc
import importlib
import importlib.metadata
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

REPS = int(os.environ.get("BENCH_INPROCESS_REPS", "30"))
CONVERSATIONS = int(os.environ.get("BENCH_INPROCESS_CONVERSATIONS", "5"))
WARMUP = 3


class _JsonFileExporter:
    """The SDK's OTLP/JSON encoder, one line per batch appended to a file (with a SimpleSpanProcessor: per span)."""

    def __init__(self, path: str) -> None:
        from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans

        self._encode = encode_spans
        self._file = open(path, "ab", buffering=0)  # noqa: SIM115 - open for the exporter's life, closed at shutdown

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        self._file.write(self._encode(spans).to_json().encode() + b"\n")
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True

    def shutdown(self) -> None:
        self._file.close()


def _variants(tmp: str) -> dict[str, Any]:
    from benchmarks import peer_worker as pw

    os.environ["LOOPTRACE_TRACE_FILE"] = os.path.join(tmp, "default.jsonl")
    os.environ["LOOPTRACE_UNDELIVERED_FILE"] = os.path.join(tmp, "undelivered.jsonl")
    found: dict[str, Any] = {"bare": pw.Bare()}
    found["looptrace-file"] = pw.Looptrace("file")
    found["raw-file"] = _raw_file(pw, os.path.join(tmp, "raw.jsonl"))
    found["looptrace-otlp"] = _looptrace_otlp(pw)
    found["raw-otlp"] = pw.RawSDK("otlp")
    if os.environ.get("LOOPTRACE_BENCH_INPROCESS_GOALS_ONLY") == "1":
        # Only what the goals divide: more repetitions in the same time, for a ratio that moves less between runs.
        return found
    # The price of a per-tool time limit (the Agent's default, 60 s): each sync call on a tool thread the run can
    # leave behind, two thread switches per call. The bare loop and the floors put no limit on the tool.
    found["looptrace-file-timed"] = pw.Looptrace("file", tool_timeout_s=60.0)
    found["looptrace-otlp-timed"] = _looptrace_otlp(pw, tool_timeout_s=60.0)
    found["raw-file-burst"] = _raw_file(pw, os.path.join(tmp, "raw-burst.jsonl"), burst=True)
    found["raw-otlp-burst"] = pw.RawSDK("otlp", burst=True)
    for key, module, package in (("openllmetry", "opentelemetry.instrumentation.anthropic",
                                  "opentelemetry-instrumentation-anthropic"),
                                 ("openinference", "openinference.instrumentation.anthropic",
                                  "openinference-instrumentation-anthropic")):
        try:
            found[key] = _Toggled(module, package)
        except ImportError as error:
            print(f"  10 in-process: {key} not importable here ({error})", file=sys.stderr)
    return found


def _raw_file(pw: Any, path: str, *, burst: bool = False) -> Any:
    """The raw variant with a SimpleSpanProcessor writing each span through the SDK's OTLP/JSON encoder."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    raw = pw.RawSDK("null", burst=burst)
    raw.provider.shutdown()
    raw.provider = TracerProvider(resource=raw._looptrace_resource())
    raw.provider.add_span_processor(SimpleSpanProcessor(_JsonFileExporter(path)))
    raw.tracer = raw.provider.get_tracer("looptrace")
    return raw


def _looptrace_otlp(pw: Any, tool_timeout_s: float | None = None) -> Any:
    """looptrace's configure(exporters="otlp"); the endpoint variables are removed again once it has read them, so
    the file variant's own pipeline (which reads the environment on each run) stays the file alone."""
    saved = {name: os.environ.get(name) for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL")}
    try:
        return pw.Looptrace("otlp", tool_timeout_s=tool_timeout_s)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _Toggled:
    """A peer instrumentor of the anthropic SDK, instrumented only around its own samples."""

    def __init__(self, module: str, package: str) -> None:
        from benchmarks import peer_worker as pw

        self.package = package
        self.provider = pw._otlp_provider()
        self.instrumentor = importlib.import_module(module).AnthropicInstrumentor()
        self.client = pw.make_client()
        self._conversation = pw.conversation
        self._tool = pw.plain_tool

    def run_once(self) -> None:
        self._conversation(self.client.messages.create, self._tool)

    def flush(self) -> None:
        assert self.provider.force_flush(), "force_flush timed out"

    def enter(self) -> None:
        self.instrumentor.instrument(tracer_provider=self.provider)

    def leave(self) -> None:
        self.instrumentor.uninstrument()

    def shutdown(self) -> None:
        self.provider.shutdown()


def _sample(variant: Any, conversations: int) -> float:
    getattr(variant, "enter", lambda: None)()
    try:
        gc.collect()
        started = time.process_time()
        for _ in range(conversations):
            variant.run_once()
        variant.flush()
        return time.process_time() - started
    finally:
        getattr(variant, "leave", lambda: None)()


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def measure(reps: int = REPS, conversations: int = CONVERSATIONS,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every variant's samples (CPU seconds per ``conversations`` conversations), interleaved and rotated."""
    with tempfile.TemporaryDirectory(prefix="looptrace-bench10-inprocess-") as tmp:
        variants = _variants(tmp)
        names = list(variants)
        for name in names:
            for _ in range(WARMUP):
                _sample(variants[name], 1)
        samples: dict[str, list[float]] = {name: [] for name in names}
        for rep in range(reps):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                samples[name].append(_sample(variants[name], conversations))
            if progress and (rep + 1) % 10 == 0:
                progress(f"  10 in-process: {rep + 1}/{reps} repetitions")
        for variant in variants.values():
            if hasattr(variant, "shutdown"):
                variant.shutdown()
    versions = {name: _version(name) for name in ("anthropic", "opentelemetry-sdk", "looptrace",
                                                  "opentelemetry-instrumentation-anthropic",
                                                  "openinference-instrumentation-anthropic")}
    return {"samples": samples, "conversations": conversations, "reps": reps, "versions": versions}


def main() -> None:
    import logging

    logging.disable(logging.CRITICAL)
    result = measure(progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
