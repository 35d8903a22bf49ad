"""Wrong input refused up front, in one line with exit 2, before anything runs: a top-level flag that does not exist,
an empty --exporter, a --trace-file that cannot be a file; and `watch` takes an empty OTLP/JSON request."""

from __future__ import annotations

import pytest

from looptrace.cli import main


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_an_unknown_top_level_flag_is_named_as_unrecognized(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--bogus"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "unrecognized arguments: --bogus" in err and "required" not in err


@pytest.mark.parametrize("command", ["demo", "run"])
@pytest.mark.parametrize("value", ["", " ", ","])
def test_an_empty_exporter_list_is_refused(workdir, capsys, monkeypatch, command, value):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")  # `run` would need one; it must not get that far
    argv = [command, "--exporter", value] + (["say hi"] if command == "run" else [])
    code, out, err = cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("looptrace: error: --exporter") and "file, console, otlp, langfuse, none" in err
    assert not (workdir / ".looptrace").exists()  # refused before anything ran


@pytest.mark.parametrize("command", ["demo", "run"])
@pytest.mark.parametrize("where", ["a directory", "under a file"])
def test_a_trace_file_that_cannot_be_one_is_refused_before_the_run(workdir, capsys, monkeypatch, command, where):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")  # `run` would need one; it must not get that far
    if where == "a directory":
        target = workdir / "traces"
        target.mkdir()
        words = "is a directory"
    else:
        (workdir / "plain.txt").write_text("x")
        target = workdir / "plain.txt" / "traces.jsonl"
        words = "is not a directory"
    argv = [command, "--trace-file", str(target)] + (["say hi"] if command == "run" else [])
    code, out, err = cli(capsys, *argv)
    assert code == 2, err
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("looptrace: error: --trace-file") and words in err
