"""What every benchmark shares: interleaved timing, robust statistics, a result row, the machine's description."""

from __future__ import annotations

import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class Row:
    """One line of the results table."""

    bench: str  # e.g. "1 telemetry cost"
    metric: str  # what was measured
    value: str  # the figure, formatted
    goal: str = ""  # the goal it is held against, if any
    met: bool | None = None  # None: context only, no goal
    context: str = ""  # absolute numbers and conditions behind the figure


def interleave(variants: dict[str, Callable[[], float]], reps: int, warmup: int = 1) -> dict[str, list[float]]:
    """Run every variant ``reps`` times, interleaved, and return each variant's samples.

    Each callable performs one sample and returns the seconds it measured (so set-up can stay outside the clock).
    The order rotates every repetition (A B C, B C A, C A B, ...) so no variant always follows the same one, and a
    garbage collection runs before each sample so that one variant's garbage is not collected on another's clock.
    """
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            samples[name].append(variants[name]())
    return samples


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def paired_median_difference(a: Sequence[float], b: Sequence[float]) -> float:
    """Median of a[i] - b[i]: samples taken next to each other share the machine's mood of the moment."""
    return statistics.median(x - y for x, y in zip(a, b))


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100), nearest-rank on the sorted values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def clock() -> float:
    return time.perf_counter()


def fmt_s(seconds: float) -> str:
    """A duration with a unit a person reads at a glance."""
    magnitude = abs(seconds)
    if magnitude < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if magnitude < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def machine() -> dict[str, str]:
    model = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        model = platform.processor() or "unknown"
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            memory = f"{int(handle.readline().split()[1]) / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        memory = "unknown"
    return {
        "cpu": model,
        "cores": str(os.cpu_count()),
        "memory": memory,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def render_table(rows: Sequence[Row]) -> str:
    """The results as a Markdown table (the README's format too)."""
    header = ("benchmark", "metric", "result", "goal", "met", "context")
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for row in rows:
        met = "" if row.met is None else ("yes" if row.met else "**no**")
        cells = (row.bench, row.metric, row.value, row.goal, met, row.context)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def say(message: str) -> None:
    """Progress for the person waiting, on stderr so that stdout stays the table."""
    print(message, file=sys.stderr, flush=True)
