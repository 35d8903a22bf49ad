"""docs/exit-codes.md, `looptrace --help` and each command's own --help say the same exit codes, and `detect --help`
says which producers it reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from looptrace.cli.app import build_parser
from looptrace.cli.exit_codes import EXIT_CODE_HELP, EXIT_CODE_TABLE

DOC = Path(__file__).resolve().parent.parent / "docs" / "exit-codes.md"
COMMANDS = ("demo", "run", "resume", "mcp list", "watch", "detect", "report", "traces show", "traces list",
            "traces push", "replay")


def expand(codes: str) -> list[int]:
    found: list[int] = []
    for part in re.split(r"[,\s]+", codes.strip()):
        if "-" in part:
            low, high = part.split("-")
            found += range(int(low), int(high) + 1)
        elif part:
            found.append(int(part))
    return found


def doc_rows() -> set[tuple[int, str]]:
    """(code, command) for each row of the table in docs/exit-codes.md."""
    rows = set()
    for line in DOC.read_text().splitlines():
        cells = [c.strip().strip("`") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) != 3 or not re.match(r"^\d", cells[0]):
            continue
        commands = COMMANDS if cells[1] == "every command" else [c.strip().strip("`") for c in cells[1].split(",")]
        rows |= {(code, command.removeprefix("looptrace ")) for code in expand(cells[0]) for command in commands}
    return rows


def table_rows() -> set[tuple[int, str]]:
    return {(code, command) for codes, commands, _ in EXIT_CODE_TABLE for code in codes
            for command in (COMMANDS if commands == "every command" else commands)}


def help_of(*path: str) -> str:
    parser = build_parser()
    for name in path:
        parser = next(a for a in parser._actions if a.dest in ("command", "traces_command", "mcp_command")).choices[name]
    return parser.format_help()


def test_the_docs_table_is_the_code_table():
    assert doc_rows() == table_rows()


def test_looptrace_help_lists_every_code_for_the_commands_that_give_it():
    top = help_of()
    for *_, meaning in EXIT_CODE_TABLE:
        assert meaning in " ".join(top.split()), meaning
    assert EXIT_CODE_HELP in top
    assert (3, "replay") in table_rows() and (3, "traces show") in table_rows()


def listed_codes(help_text: str) -> set[int]:
    epilog = help_text[help_text.index("exit codes:"):]
    listed = set()
    for line in epilog.splitlines()[1:]:
        found = re.match(r"^\s+(\d+(?:-\d+)?(?:,\s*\d+(?:-\d+)?)*)\s", line)
        if found:
            listed |= set(expand(found.group(1)))
    return listed


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_help_gives_only_codes_the_table_gives_it(command):
    listed = listed_codes(help_of(*command.split()))
    assert listed, command
    given = {code for code, name in table_rows() if name == command}
    assert listed <= given, (command, listed - given)


@pytest.mark.parametrize("command", ["demo", "run", "resume", "mcp list"])
def test_a_command_help_made_from_the_table_prints_its_own_rows_and_no_other(command):
    text = help_of(*command.split())
    assert listed_codes(text) == {code for code, name in table_rows() if name == command}
    flat = " ".join(text.split())
    others = [meaning for _, commands, meaning in EXIT_CODE_TABLE
              if commands != "every command" and command not in commands]
    assert others and not [meaning for meaning in others if meaning in flat], command
    assert "docs/exit-codes.md" in flat


def test_detect_help_names_every_producer_it_reads():
    text = " ".join(help_of("detect").split())
    assert "OpenLLMetry" in text and "OpenInference" in text
