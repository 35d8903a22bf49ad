"""`looptrace detect --langfuse` with nothing listening at LANGFUSE_BASE_URL says it cannot connect, in each retry's
line and at the end, and never that Langfuse asked it to wait."""

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
    assert code == 2 and waits
    assert "asked to wait" not in said
    lines = said.splitlines()
    assert all("cannot connect to Langfuse" in line for line in lines), said
    assert len(lines) == len(waits) + 1  # one line per retry, and the error
