"""Every scripted run the tests make, stored and read back by `looptrace detect`, must give the live anomalies.

`record(monkeypatch)` watches the `Agent` runs of one test: each run's live anomalies, the detector config it ran with
and the tracer provider its spans went to. When the provider is a test's `Spans` provider (the `spans` fixture), its
finished spans are written as a trace file, one span a line, read back the way `looptrace detect` reads a file, and
judged by the run rebuilder with the same thresholds; `disagreements` lists every run whose anomalies (type, turn,
count, and what each loop cost) differ. conftest.py fails the test that made such a run, as the network guard does.

Left out, each for a stated reason: runs without a `Spans` provider (nothing stored), runs with the detector off, runs
with a judge (offline there is none), and runs with `repeat_threshold=1`, whose repeat is stopped before it runs and
so never reaches a span. The types the stored run could not check (`Verdict.rules_not_run`) are not compared.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

from looptrace.instrumentation.detector import DetectorConfig
from looptrace.runtime import Agent

# provider id -> its in-memory exporter, for the providers the `spans` fixture made in this test
PROVIDERS: dict[int, Any] = {}


class Recorder:
    def __init__(self) -> None:
        self.runs: list[tuple[Any, DetectorConfig, Any]] = []  # (provider, config, result)

    def disagreements(self, directory_of: Any) -> list[str]:
        by_provider: dict[int, list[tuple[DetectorConfig, Any]]] = {}
        for provider, config, result in self.runs:
            if id(provider) in PROVIDERS and set(result.trace_id) != {"0"}:
                by_provider.setdefault(id(provider), []).append((config, result))
        problems = []
        for provider_id, runs in by_provider.items():
            verdicts = _detect(PROVIDERS[provider_id], runs[0][0], directory_of())
            for _config, result in runs:
                live = _seen(result.anomalies)
                verdict = verdicts.get(result.trace_id)
                if verdict is None:
                    problems.append(f"run {result.trace_id}: detect found no such run (live: {live})")
                    continue
                offline = _seen(verdict.anomalies)
                live = [a for a in live if a[0] not in verdict.rules_not_run]
                if live != offline:
                    problems.append(f"run {result.trace_id}: live {live} != detect {offline}")
        return problems


def _seen(anomalies: list[Any]) -> list[tuple[Any, ...]]:
    """What must agree: each anomaly's type, turn and count, and what its loop cost (turns, tokens, USD)."""
    return sorted((a.type, a.turn, a.count, _cost(a.cost)) for a in anomalies)


def _cost(cost: Any) -> tuple[Any, ...] | None:
    if cost is None:
        return None
    return (cost.since_turn, cost.turns, cost.input_tokens, cost.output_tokens,
            None if cost.usd is None else round(cost.usd, 9))


def _detect(exporter: Any, config: DetectorConfig, directory: Path) -> dict[str, Any]:
    from looptrace.cli.detect_command import detection_spans
    from looptrace.cli.trace_reading import LineReporter
    from looptrace.instrumentation.offline.trace_detect import detect_spans
    from looptrace.instrumentation.tracefile.encode import encode_traces_data

    path = directory / "traces.jsonl"
    path.write_text("".join(encode_traces_data([span]) + "\n" for span in exporter.get_finished_spans()),
                    encoding="utf-8")
    with LineReporter(path, 64 * 1024 * 1024) as report:
        return {v.trace_id: v for v in detect_spans(detection_spans(path, report), config)}


def record(monkeypatch: Any) -> Recorder:
    recorder = Recorder()
    PROVIDERS.clear()
    original_init, original_run, original_arun = Agent.__init__, Agent.run, Agent.arun

    @functools.wraps(original_init)
    def init(self: Agent, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        detector = kwargs.get("detector", True)
        config = detector if isinstance(detector, DetectorConfig) else DetectorConfig()
        comparable = (detector is not False and config.judge is None and config.repeat_threshold != 1
                      and getattr(self, "_detector_config", None) is not None
                      and self._detector_config.judge is None)
        self._parity = (kwargs.get("tracer_provider"), dataclasses.replace(config, judge=None)) if comparable else None

    def keep(self: Agent, result: Any) -> Any:
        if getattr(self, "_parity", None) is not None:
            provider, config = self._parity
            recorder.runs.append((provider, config, result))
        return result

    @functools.wraps(original_run)
    def run(self: Agent, *args: Any, **kwargs: Any) -> Any:
        return keep(self, original_run(self, *args, **kwargs))

    @functools.wraps(original_arun)
    async def arun(self: Agent, *args: Any, **kwargs: Any) -> Any:
        return keep(self, await original_arun(self, *args, **kwargs))

    monkeypatch.setattr(Agent, "__init__", init)
    monkeypatch.setattr(Agent, "run", run)
    monkeypatch.setattr(Agent, "arun", arun)
    return recorder


__all__ = ["PROVIDERS", "Recorder", "record"]
