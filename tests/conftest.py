"""Shared fixtures: a private tracer provider whose finished spans the tests can read, the guard that keeps every
test on this machine, and the CLI tests' working directory and Messages-API fake.

Tests never set the global tracer provider (it can be set once per process); they hand the provider to the Agent.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile
from pathlib import Path

import checkout_guard
import detect_parity
import network_guard
import pytest
import structlog
from fakes.messages_api import FakeMessagesAPI
from hypothesis import HealthCheck, settings
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

# Installed for the whole process, not per test: a thread a test started (an exporter, a project look-up) is held to
# the same rule after the test has returned. Python processes the tests start get it too, through PYTHONPATH.
network_guard.install()
_CHILD_GUARD = str(Path(__file__).parent / "child_network_guard")
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_CHILD_GUARD, os.environ.get("PYTHONPATH")) if p)
# A resumed run is recorded under XDG_STATE_HOME (runtime/resume_claims.py): the suite's resumes, and those of the
# processes its tests start, go to a directory of this process's own, never to the user's.
_STATE_HOME = tempfile.mkdtemp(prefix="looptrace-test-state-")
os.environ["XDG_STATE_HOME"] = _STATE_HOME
atexit.register(shutil.rmtree, _STATE_HOME, True)
# Runs whose telemetry nobody configured write to the default trace file under the working directory: each test's
# own (see _works_in_a_directory_of_its_own), never the checkout's.
checkout_guard.isolate()
_CHECKOUT_AT_START: checkout_guard.Snapshot = {}
# Tests press Ctrl-C on the processes they start. A suite started in the background (`pytest -q &` in a script, some
# CI runners) inherits SIGINT ignored, and every process it starts would inherit that too and never hear the key:
# Python's own handler here is reset to the default in each child, which then raises KeyboardInterrupt as it should.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionstart(session: pytest.Session) -> None:
    global _CHECKOUT_AT_START
    _CHECKOUT_AT_START = checkout_guard.snapshot()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fails the session whose tests changed the checkout's .looptrace/ (a late write the per-test check missed,
    such as a batch exporter flushing at exit, included)."""
    if hasattr(session.config, "workerinput"):
        return  # the controller checks, once
    changed = checkout_guard.changes(_CHECKOUT_AT_START, checkout_guard.snapshot())
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"the tests changed {checkout_guard.GUARDED}: {', '.join(changed)}"
        if reporter is not None:
            reporter.write_line(f"FAILED: {message}", red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts): two workers a core, at most 8. Most of the suite waits on sockets,
    subprocesses and a tool's sleep rather than computing, so two a core keep the cores busy; more would only crowd a
    small machine."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(8, 2 * cores)


# No test may fail because the machine is busy: Hypothesis's per-example deadline and its "too slow" health check are
# both wall-clock limits, so they are off for every property test (each still bounds its own example count).
settings.register_profile("looptrace", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("looptrace")


class Spans:
    """The finished spans of a test, with the look-ups the assertions need; ``sent_to_langfuse`` has the same spans
    as Langfuse's exporter sends them (its mapping, with OpenInference's, added at export)."""

    def __init__(self) -> None:
        from looptrace.instrumentation.export.mapped import MappedSpanProcessor, mappings_for

        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.langfuse_exporter = InMemorySpanExporter()
        self.provider.add_span_processor(MappedSpanProcessor(SimpleSpanProcessor(self.langfuse_exporter),
                                                             mappings_for(["langfuse"])))
        detect_parity.PROVIDERS[id(self.provider)] = self.exporter  # its runs are read back by detect after the test

    @property
    def all(self):
        return list(self.exporter.get_finished_spans())

    @property
    def sent_to_langfuse(self):
        return list(self.langfuse_exporter.get_finished_spans())

    def sent(self, prefix: str):
        """The one span named ``prefix``*, as Langfuse's exporter sends it."""
        found = [s for s in self.sent_to_langfuse if s.name.startswith(prefix)]
        assert len(found) == 1, f"expected one span named {prefix}*, found {[s.name for s in found]}"
        return found[0]

    def named(self, prefix: str):
        return [s for s in self.all if s.name.startswith(prefix)]

    def one(self, prefix: str):
        found = self.named(prefix)
        assert len(found) == 1, f"expected one span named {prefix}*, found {[s.name for s in self.all]}"
        return found[0]

    def children_of(self, parent):
        return [s for s in self.all if s.parent is not None and s.parent.span_id == parent.context.span_id]


@pytest.fixture
def spans() -> Spans:
    return Spans()


@pytest.fixture(autouse=True)
def _fresh_structlog():
    # The CLI configures structlog for its process; in-process CLI tests must not leave that behind for the next test.
    yield
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
def _detect_agrees_with_the_live_run(monkeypatch, tmp_path_factory):
    """Fails the test whose scripted run, stored and read back by `looptrace detect`, gives other anomalies (type,
    turn, count) than the run found live (see detect_parity.py)."""
    recorder = detect_parity.record(monkeypatch)
    yield
    problems = recorder.disagreements(lambda: tmp_path_factory.mktemp("parity"))
    if problems:
        pytest.fail("detect disagrees with the live run: " + "; ".join(problems), pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _the_session_works_outside_the_checkout(tmp_path_factory):
    """Module and session fixtures are set up before a test's own directory is made: they run in one of the
    session's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("session-directory"))
        yield


@pytest.fixture(autouse=True)
def _works_in_a_directory_of_its_own(tmp_path, monkeypatch):
    """Each test runs in its tmp_path: what a run writes under the working directory by default (the trace file, the
    undelivered list, a paused run's state) lands there, in processes the test starts too."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _leaves_the_checkouts_traces_alone():
    """Fails the test that wrote into (or removed from) the checkout's .looptrace/: tests use tmp_path."""
    before = checkout_guard.snapshot()
    yield
    changed = checkout_guard.changes(before, checkout_guard.snapshot())
    if changed:
        pytest.fail(f"the test (or one running beside it) changed {checkout_guard.GUARDED}: {', '.join(changed)}",
                    pytrace=False)


@pytest.fixture(autouse=True)
def _stays_on_this_machine():
    """Fails the test that tried to reach a host beyond loopback, even if the code under test swallowed the error."""
    network_guard.take_attempts()  # what an earlier test's leftover thread tried is not this test's doing
    yield
    attempts = network_guard.take_attempts()
    if attempts:
        pytest.fail(f"the test tried to reach outside the machine: {', '.join(sorted(set(attempts)))}", pytrace=False)


# --- a working directory and the Messages-API fake, for the CLI's tests ---------------------------------------------

@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh current directory, and none of the variables that would send the CLI's output elsewhere."""
    monkeypatch.chdir(tmp_path)
    for name in ("LOOPTRACE_EXPORTER", "LOOPTRACE_TRACE_FILE", "LOOPTRACE_UNDELIVERED_FILE", "OTEL_TRACES_EXPORTER",
                 "OTEL_SDK_DISABLED", "LOOPTRACE_CAPTURE_CONTENT", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
                 "LOOPTRACE_MAX_LINE_BYTES", "LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY",
                 "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.fixture
def api(monkeypatch):
    """The local Messages-API fake, which the anthropic SDK reaches through ANTHROPIC_BASE_URL."""
    with FakeMessagesAPI() as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        yield fake
