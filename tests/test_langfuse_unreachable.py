"""`looptrace detect --langfuse` and `looptrace traces push` with nothing listening at LANGFUSE_BASE_URL: a refused
connection ends them at once (no retries), says it cannot connect, never that Langfuse asked it to wait, and never
that spans are lost while they stay listed."""

from __future__ import annotations

import contextlib
import io

from fakes.otlp_receiver import unused_port

from looptrace.cli.trace_commands import main as trace_commands
from looptrace.instrumentation.langfuse.api import LangfuseAPI


def test_an_unreachable_langfuse_is_said_to_be_unreachable(monkeypatch):
    waits: list[float] = []
    original = LangfuseAPI.__init__

    def without_real_waits(self, *args, **options):  # the waits are recorded, not slept: the test stays fast
        original(self, *args, **{**options, "sleep": waits.append})

    monkeypatch.setattr(LangfuseAPI, "__init__", without_real_waits)
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk-lf-test")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-test")
    monkeypatch.setenv("LANGFUSE_BASE_URL", f"http://127.0.0.1:{unused_port()}")
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = trace_commands(["detect", "--langfuse"])
    said = err.getvalue()
    assert code == 2
    assert "asked to wait" not in said
    # Nothing listens there: retrying cannot help (docs/reliability.md), so no wait and one line, not 1+2+4+8+16 s.
    assert waits == []
    assert said.count("\n") == 1 and "cannot connect to Langfuse" in said and "refused" in said, said


def test_a_push_to_an_unreachable_langfuse_fails_at_once_and_says_the_spans_stay_listed(monkeypatch, tmp_path):
    from test_trace_file import finished_spans

    from looptrace.instrumentation.tracefile.undelivered import UndeliveredList
    from looptrace.instrumentation.tracefile.write import TraceFileWriter

    waits: list[float] = []
    original = LangfuseAPI.__init__

    def without_real_waits(self, *args, **options):
        original(self, *args, **{**options, "sleep": waits.append})

    monkeypatch.setattr(LangfuseAPI, "__init__", without_real_waits)
    spans = finished_spans()
    writer = TraceFileWriter(tmp_path / "traces.jsonl")
    for span in spans:
        writer.write_span(span)
    writer.close()
    listing = UndeliveredList(tmp_path / "undelivered.jsonl", trace_file=tmp_path / "traces.jsonl")
    listing.append("langfuse", spans)
    listing.keep_score({"id": "score-1", "traceId": "ab" * 16, "name": "looped", "value": 1})
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "LOOPTRACE_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk-lf-test")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-test")
    monkeypatch.setenv("LANGFUSE_BASE_URL", f"http://127.0.0.1:{unused_port()}")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = trace_commands(["traces", "push", "--file", str(listing.path)])
    assert code == 1 and waits == []  # the score post gave up at the refusal, not after 1+2+4+8+16 s of retries
    assert "still pending" in out.getvalue(), out.getvalue()
    warned = err.getvalue()
    assert "refused" in warned and "lost" not in warned, warned  # the spans are listed, as stdout says
    assert str(listing.path) in warned
    assert listing.pending_spans("langfuse") == len(spans) and listing.pending()["langfuse"].scores
