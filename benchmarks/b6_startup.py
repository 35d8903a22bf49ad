"""Start-up: CPU time of `import looptrace` and `looptrace --help`, against `import opentelemetry.sdk.trace`.

Each variant is a fresh interpreter; the figure is the CPU (user + system) the child used, from getrusage, so a busy
machine's waiting does not count. Variants are interleaved (``common.interleave``) and compared by their medians.
Goal: neither looptrace variant costs more than the OpenTelemetry SDK's tracing import, which any traced program pays.
"""

from __future__ import annotations

import resource
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from .common import Row, interleave, say

PYTHON = sys.executable


def _help_command() -> list[str]:
    script = shutil.which("looptrace", path=str(Path(PYTHON).parent))
    return [script, "--help"] if script else [PYTHON, "-m", "looptrace", "--help"]


VARIANTS = {
    "python -c pass": [PYTHON, "-c", "pass"],
    "import opentelemetry.sdk.trace": [PYTHON, "-c", "import opentelemetry.sdk.trace"],
    "import looptrace": [PYTHON, "-c", "import looptrace"],
    "looptrace --help": _help_command(),
    "from looptrace import Agent": [PYTHON, "-c", "from looptrace import Agent"],
}


def _cpu_of(command: list[str]) -> float:
    """The CPU seconds one run of ``command`` used (its own and its children's)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(reps: int) -> dict[str, float]:
    """Median CPU seconds per variant."""
    samples = interleave({name: (lambda c=command: _cpu_of(c)) for name, command in VARIANTS.items()}, reps)
    return {name: statistics.median(values) for name, values in samples.items()}


def run(quick: bool = False) -> list[Row]:
    reps = 4 if quick else 12
    say(f"  {len(VARIANTS)} commands x {reps} interleaved runs")
    medians = measure(reps)
    baseline = medians["import opentelemetry.sdk.trace"]
    context = ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in medians.items())
    rows = []
    for name in ("import looptrace", "looptrace --help"):
        ratio = medians[name] / baseline
        rows.append(Row("6 start-up", f"CPU of `{name}` / `import opentelemetry.sdk.trace`", f"{ratio:.2f}x",
                        goal="≤ 1x", met=ratio <= 1.0, context=context if name == "looptrace --help" else ""))
    ratio = medians["from looptrace import Agent"] / baseline
    rows.append(Row("6 start-up", "CPU of `from looptrace import Agent` / the same", f"{ratio:.2f}x"))
    return rows
