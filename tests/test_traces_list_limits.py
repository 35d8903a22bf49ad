"""`looptrace traces list --last N` and `--since TIME`: a long file need not be read to its first run."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta

import pytest

from looptrace.cli import main

HOUR_NS = 3600 * 10**9


def root_line(number: int, start_ns: int) -> str:
    span = {"traceId": f"{number:032x}", "spanId": f"{number:016x}", "name": f"invoke_agent run{number}",
            "startTimeUnixNano": str(start_ns), "endTimeUnixNano": str(start_ns + 10**9),
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}}]}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"scope": {"name": "s"}, "spans": [span]}]}]}) + "\n"


@pytest.fixture
def five_runs(tmp_path):
    """Five runs, started 5, 4, 3, 2 and 1 hours ago, oldest first."""
    now = time.time_ns()
    path = tmp_path / "t.jsonl"
    path.write_text("".join(root_line(n, now - (6 - n) * HOUR_NS) for n in range(1, 6)))
    return path


def listed(capsys, *argv: str) -> tuple[int, list[str], str]:
    code = main(["traces", "list", *argv])
    out, err = capsys.readouterr()
    return code, [line.split()[0][-1] for line in out.splitlines()], err


def test_last_n_lists_only_the_latest_runs_in_file_order(five_runs, capsys):
    assert listed(capsys, "--file", str(five_runs), "--last", "2")[:2] == (0, ["4", "5"])
    assert listed(capsys, "--file", str(five_runs), "--last", "9")[:2] == (0, ["1", "2", "3", "4", "5"])


@pytest.mark.parametrize("since, runs", [("2h30m", ["4", "5"]), ("150m", ["4", "5"]), ("1d", ["1", "2", "3", "4", "5"]),
                                         ("90m", ["5"])])
def test_since_a_relative_time(five_runs, capsys, since, runs):
    assert listed(capsys, "--file", str(five_runs), "--since", since)[:2] == (0, runs)


def test_since_an_iso_time_and_with_last(five_runs, capsys):
    since = (datetime.now() - timedelta(hours=3, minutes=30)).isoformat(timespec="seconds")
    assert listed(capsys, "--file", str(five_runs), "--since", since)[:2] == (0, ["3", "4", "5"])
    assert listed(capsys, "--file", str(five_runs), "--since", since, "--last", "1")[:2] == (0, ["5"])


@pytest.mark.parametrize("flag, value", [("--since", "yesterday"), ("--since", "-2h"), ("--last", "0"),
                                         ("--last", "x")])
def test_a_bad_limit_is_a_usage_error(five_runs, capsys, flag, value):
    with pytest.raises(SystemExit) as exited:
        main(["traces", "list", "--file", str(five_runs), flag, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and err.count("\n") == 1
