"""Where the OTLP path's time goes per turn: benchmark 10's conversation under cProfile, own time grouped by layer.

    python -m benchmarks.profile_otlp [--exporter otlp|file] [--conversations N] [--raw]

Runs looptrace's ``configure(exporters="otlp")`` (or the file default, ``--sdk-path``: the same on the SDK's span
pipeline, or ``--raw``: the raw SDK OTLP floor) against
the fake Messages API and a discarding OTLP sink, each in its own process; a flush after every conversation, which
the SDK's BatchSpanProcessor runs on the caller's thread, so the export's encoding and sending are on the profiled
thread too. Prints µs per turn of own time per layer (building attributes, SDK spans, encoding, HTTP, the model call
itself) and the top functions.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import threading
import time
from collections import defaultdict

from .b10_peers import CALLS, _config
from .servers import MessagesAPIServer, OTLPSink

#: (layer, path fragment) in order: the first that matches a function's file names its layer.
LAYERS = (
    ("encoding (OTLP protobuf / JSON)", "exporter/otlp/proto/common"),
    ("encoding (OTLP protobuf / JSON)", "google/protobuf"),
    ("encoding (OTLP protobuf / JSON)", "tracefile/encode"),
    ("encoding (OTLP protobuf / JSON)", "otlp_wire"),
    ("export: HTTP, gzip, delivery", "exporter/otlp/proto/http"),
    ("export: HTTP, gzip, delivery", "instrumentation/delivery"),
    ("export: HTTP, gzip, delivery", "instrumentation/exporters"),
    ("export: HTTP, gzip, delivery", "requests/"),
    ("export: HTTP, gzip, delivery", "urllib3/"),
    ("SDK spans and processors", "opentelemetry/sdk/"),
    ("SDK spans and processors", "opentelemetry/attributes"),
    ("API, context", "opentelemetry/"),
    ("looptrace: direct spans", "instrumentation/direct_spans"),
    ("looptrace: building attributes", "instrumentation/"),
    ("looptrace: runtime", "runtime/"),
    ("anthropic SDK, httpx (the bare loop's share)", "anthropic/"),
    ("anthropic SDK, httpx (the bare loop's share)", "httpx"),
    ("anthropic SDK, httpx (the bare loop's share)", "httpcore"),
    ("anthropic SDK, httpx (the bare loop's share)", "pydantic"),
)


#: The profilers' own calls and waiting (a blocked lock or queue costs no CPU; the profiler's clock says otherwise).
_IDLE = ("_lsprof.Profiler", "'acquire' of '_thread", "'get' of '_queue.SimpleQueue'", "'wait' of")


def _layer(filename: str) -> str:
    for layer, fragment in LAYERS:
        if fragment in filename:
            return layer
    return "other (stdlib, json, sockets, threads)"


def _profile_new_threads(profilers: list[cProfile.Profile]) -> None:
    """Every thread started from now on (the BatchSpanProcessor's export thread) runs under a profiler of its own,
    timed by its own CPU clock, so waiting does not count."""
    run = threading.Thread.run

    def profiled_run(thread: threading.Thread) -> None:
        profiler = cProfile.Profile(time.thread_time)
        profilers.append(profiler)
        profiler.enable()
        try:
            run(thread)
        finally:
            profiler.disable()

    threading.Thread.run = profiled_run  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_otlp", description=__doc__)
    parser.add_argument("--exporter", default="otlp", choices=("otlp", "file"))
    parser.add_argument("--raw", action="store_true", help="the raw SDK OTLP floor instead of looptrace")
    parser.add_argument("--sdk-path", action="store_true",
                        help="looptrace OTLP made to take the SDK's span pipeline (what the direct path replaced)")
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    import logging

    logging.disable(logging.CRITICAL)
    with MessagesAPIServer(turns=CALLS) as api, OTLPSink() as sink:
        os.environ.update({"BENCH_PEERS_CONFIG": json.dumps(_config()), "BENCH_PEERS_API_URL": api.url,
                           "BENCH_PEERS_API_KEY": api.api_key, "BENCH_PEERS_SINK_URL": sink.url})
        from . import peer_worker as pw

        importlib_reload = __import__("importlib").reload
        importlib_reload(pw)  # it reads the environment at import
        profilers: list[cProfile.Profile] = []
        _profile_new_threads(profilers)
        if args.raw:
            variant = pw.RawSDK("otlp")
        elif args.sdk_path:
            from .b10_inprocess import _looptrace_otlp

            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink.url
            variant = _looptrace_otlp(pw, sdk_path=True)
        else:
            variant = pw.Looptrace(args.exporter)
        for _ in range(5):
            variant.run_once()
            variant.flush()
        for threads_profiler in profilers:  # the warm-up's share of the export thread is not counted
            threads_profiler.disable()
            threads_profiler.clear()  # type: ignore[attr-defined]
            threads_profiler.enable()
        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
        for _ in range(args.conversations):
            variant.run_once()
            variant.flush()
        profiler.disable()
        for threads_profiler in profilers:
            threads_profiler.disable()
        variant.shutdown()
    turns = args.conversations * CALLS
    stats = pstats.Stats(profiler)
    for threads_profiler in profilers:
        threads_profiler.create_stats()
        if threads_profiler.stats:  # type: ignore[attr-defined]
            stats.add(threads_profiler)
    by_layer: dict[str, float] = defaultdict(float)
    rows = []
    for (filename, line, name), (_, calls, own, _cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        if any(idle in name for idle in _IDLE):
            continue
        by_layer[_layer(filename)] += own
        rows.append((own, calls, f"{filename.split('site-packages/')[-1]}:{line}({name})"))
    total = sum(by_layer.values())
    what = "raw SDK OTLP" if args.raw else "looptrace otlp, SDK path" if args.sdk_path else f"looptrace {args.exporter}"
    print(f"{what}: {total / turns * 1e6:,.0f} µs/turn "
          f"of profiled own time ({args.conversations} conversations; profiling inflates every call)")
    for layer, own in sorted(by_layer.items(), key=lambda item: -item[1]):
        print(f"  {own / turns * 1e6:8,.0f} µs/turn  {own / total:5.1%}  {layer}")
    print("top functions by own time (µs/turn, calls/turn):")
    for own, calls, where in sorted(rows, reverse=True)[:args.top]:
        print(f"  {own / turns * 1e6:8,.1f}  {calls / turns:6.1f}  {where}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
