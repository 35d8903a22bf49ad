"""The exit codes, part of the interface (scripts branch on them): listed here and, for people, in ``--help``.

Standard library only, like everything the trace commands import: `looptrace detect` starts without the runtime.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_USAGE = 2  # bad flags, a tools file that does not import, a missing key, an unreadable trace file
EXIT_NOT_FOUND = 3  # traces show: no such trace
EXIT_AWAITING_APPROVAL = 40  # the run paused for a person's decision; its state file resumes it
EXIT_INTERRUPTED = 130
# 128 + SIGPIPE, as a shell reports a program whose reader went away (`| head`): for the commands that list, and stop
# there; a command that ran an agent exits with the run's status whatever became of stdout.
EXIT_CLOSED_PIPE = 141
EXIT_TERMINATED = 143  # 128 + SIGTERM, as shells report it

# The commands that run an agent (replay: offline) and exit with how it ended.
RUNS = ("run", "resume", "demo", "replay")
EVERY = "every command"

# (codes, commands, meaning): the one table of exit codes. `looptrace --help` is made from it, and
# docs/exit-codes.md is held to it by a test, as is each command's own --help.
EXIT_CODE_TABLE: tuple[tuple[tuple[int, ...], str | tuple[str, ...], str], ...] = (
    ((0,), EVERY, "done: the model ended its turn, no anomaly, the run shown or listed, the report written, "
                  "nothing left to push, watch stopped cleanly"),
    ((1,), RUNS, "error: the API call failed (replay: also a replay that went past the recording)"),
    ((1,), ("detect",), "anomalies found"),
    ((1,), ("traces push",), "spans pending, uncertain or lost, or lines of the list it could not read"),
    ((2,), EVERY, "usage: a bad flag or setting, a tools file, a missing key, an unreadable or non-trace file, "
                  "a port taken, Langfuse refusing or unreachable"),
    ((3,), ("traces show", "replay"), "no such trace in the file"),
    ((10, 11, 12, 13, 14), RUNS, "a limit: max_turns, token_budget, cost_budget, timeout, loop_budget"),
    ((20, 21, 22, 23), RUNS, "the model stopped: max_tokens, stop_sequence, refusal, context_window"),
    ((30,), RUNS, "stopped_by_detector"),
    ((40,), ("run", "resume"),
     "awaiting_approval: paused for a person's decision; `looptrace resume STATE` finishes it"),
    ((130,), ("run", "resume", "demo"), "interrupted (Ctrl-C)"),
    ((141,), ("detect", "traces show", "traces list", "traces push", "mcp list", "replay"),
     "stdout closed early (e.g. `| head`): a listing stops there (replay: with --all); a run's exit code stays its "
     "status"),
    ((143,), ("run", "resume", "demo"), "terminated (SIGTERM)"),
)


def exit_code_help(command: str | None = None) -> str:
    """The exit codes as `--help` ends: the whole table (``looptrace --help``), or only the rows of one ``command``
    (``"run"``, ``"traces show"``): what that command can exit with, as docs/exit-codes.md lists it."""
    where = "every command's" if command else "the table"
    lines = [f"exit codes: ({where}: docs/exit-codes.md)"]
    for codes, commands, meaning in EXIT_CODE_TABLE:
        if command is not None and commands != EVERY and command not in commands:
            continue
        numbers = f"{codes[0]}-{codes[-1]}" if len(codes) > 2 else ", ".join(map(str, codes))
        if command is None:
            who = commands if isinstance(commands, str) else ", ".join(commands)
            lines.append(f"  {numbers:<6} {who}: {meaning}")
        else:
            lines.append(f"  {numbers:<6} {meaning}")
    return "\n".join(lines)


EXIT_CODE_HELP = exit_code_help()
