"""The peers' own virtual environments, made (once) for benchmark 10, reused while their requirements stay the same.

Each peer gets a venv of its own: instrumentations of the same SDK patch the same functions and some share import
paths, so they are never installed side by side. Every venv pins the packages the conversation itself runs on
(``anthropic``, ``pydantic``, the OpenTelemetry SDK and OTLP/HTTP exporter) to the versions of the environment running
the benchmark, so the bare loop costs the same everywhere and the rows differ only by the instrumentation.

The venvs live in ``$LOOPTRACE_BENCH_PEERS_DIR`` (default ``~/.cache/looptrace-bench-peers``); pip reaches PyPI as it
is configured on the machine. A peer that cannot be installed is reported as such, never measured by stand-in.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

#: Each peer's own distributions, pinned to the releases measured (bump deliberately, then re-run).
PEER_REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "openllmetry": ("opentelemetry-instrumentation-anthropic==0.62.4",),
    "otel-genai": ("opentelemetry-instrumentation-genai-anthropic==1.3b0",),
    "openinference": ("openinference-instrumentation-anthropic==3.1.0",),
    "langfuse": ("langfuse==5.0.4",),
    "logfire": ("logfire==5.4.0",),
}

#: Pinned to this environment's versions in every peer venv.
SHARED = ("anthropic", "pydantic", "opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http")


#: The in-process set's venv: looptrace itself (this checkout) beside the peers that can share one process, at their
#: current releases (unpinned: whatever the index has today; the table prints the versions it ran).
INPROCESS_PEERS = ("opentelemetry-instrumentation-anthropic", "openinference-instrumentation-anthropic")
_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class PeerEnv:
    name: str
    python: str | None  # None: not installed
    problem: str = ""  # why not, in a line


def venvs_dir() -> Path:
    return Path(os.environ.get("LOOPTRACE_BENCH_PEERS_DIR") or Path.home() / ".cache" / "looptrace-bench-peers")


def requirements(peer: str) -> list[str]:
    shared = [f"{name}=={importlib.metadata.version(name)}" for name in SHARED]
    return [*PEER_REQUIREMENTS[peer], *shared]


def ensure_inprocess() -> PeerEnv:
    """The in-process set's venv: this checkout (editable) and the current releases of the peers in INPROCESS_PEERS,
    the shared packages pinned to this environment's versions. Made once a day at most (the marker names the day)."""
    import datetime

    shared = [f"{name}=={importlib.metadata.version(name)}" for name in SHARED]
    return ensure("inprocess", ["-e", str(_ROOT), *INPROCESS_PEERS, *shared],
                  marker_extra=datetime.date.today().isoformat())


def ensure(peer: str, wanted_requirements: list[str] | None = None, marker_extra: str = "") -> PeerEnv:
    """The peer's venv, created or brought up to date if its requirements changed."""
    wanted_requirements = wanted_requirements or requirements(peer)
    wanted = "\n".join([f"python {sys.version.split()[0]}", *wanted_requirements, *filter(None, [marker_extra])]) + "\n"
    home = venvs_dir() / peer
    marker = home / "bench-requirements.txt"
    python = home / "bin" / "python"
    if marker.exists() and marker.read_text() == wanted and python.exists():
        return PeerEnv(peer, str(python))
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(home)], check=True, capture_output=True,
                           text=True, timeout=300)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *wanted_requirements], check=True,
                       capture_output=True, text=True, timeout=900)
    except subprocess.CalledProcessError as error:
        lines = [line for line in (error.stderr or "").splitlines() if line.strip() and "is ignored" not in line]
        return PeerEnv(peer, None, f"could not be installed here ({lines[-1].strip() if lines else error})")
    except subprocess.TimeoutExpired:
        return PeerEnv(peer, None, "could not be installed here (pip timed out)")
    marker.write_text(wanted)
    return PeerEnv(peer, str(python))


def ensure_all(peers: list[str]) -> dict[str, PeerEnv]:
    """Every peer's venv, installed in parallel (pip waits on the network more than on the CPU)."""
    with ThreadPoolExecutor(max_workers=len(peers) or 1) as pool:
        return dict(zip(peers, pool.map(ensure, peers)))
