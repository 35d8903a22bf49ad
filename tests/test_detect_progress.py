"""`looptrace detect FILE` shows progress (tqdm's) on stderr for a big file read at a terminal, and nowhere else:
stdout stays the verdicts, and a small file or a pipe never even loads the progress library."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from looptrace.cli import main, trace_reading


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_big_file_at_a_terminal_shows_progress_on_stderr_only(workdir, capsys, monkeypatch):
    assert main(["demo", "--json", "--trace-file", "t.jsonl"]) == 0
    (workdir / "big.jsonl").write_bytes((workdir / "t.jsonl").read_bytes() * 50)
    capsys.readouterr()
    monkeypatch.setattr(trace_reading, "PROGRESS_MIN_BYTES", 1)  # "big": anything, for the test
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["detect", "big.jsonl"]) == 0
    out = capsys.readouterr().out
    shown = terminal.getvalue()
    assert "reading big.jsonl:" in shown and "B/s]" in shown  # tqdm's bar, drawn in place
    assert "reading" not in out and "%" not in out
    assert shown.splitlines()[-1].split("\r")[-1].startswith("0 anomalies found in big.jsonl")  # bar cleared


@pytest.mark.slow
def test_a_small_file_never_loads_the_progress_library(workdir, capsys):
    assert main(["demo", "--json", "--trace-file", "t.jsonl"]) == 0
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "looptrace", "detect", "t.jsonl"], cwd=workdir,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| tqdm" not in done.stderr and "rich" not in done.stderr
