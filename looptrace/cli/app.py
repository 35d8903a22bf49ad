"""`looptrace`: run an agent, watch it, read its traces. The full command line: one parser with every command, one
logging set-up, and one way each kind of failure is said.

Each command lives in its own module (``demo_command``, ``run_command``, ``watch_command``, ``replay_command``, and
the trace commands ``detect``, ``traces show | list | push``). Exit codes are part of the interface (scripts branch on
them); they are listed in ``exit_codes`` and in `--help`.
"""

from __future__ import annotations

import argparse
import sys

from looptrace import __version__
from looptrace.cli.common import Parser, UsageError, silence_stdout, tolerate_any_terminal
from looptrace.cli.demo_command import add_demo_command
from looptrace.cli.exit_codes import EXIT_CLOSED_PIPE, EXIT_CODE_HELP, EXIT_USAGE
from looptrace.cli.logging_setup import configure_logging
from looptrace.cli.mcp_command import add_mcp_command
from looptrace.cli.replay_command import add_replay_command
from looptrace.cli.resume_command import add_resume_command
from looptrace.cli.run_command import add_run_command
from looptrace.cli.trace_commands import add_trace_commands
from looptrace.cli.watch_command import add_watch_command
from looptrace.instrumentation import ConfigurationError


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run the command, and return its exit code."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at interpreter exit, so a closed pipe is noticed where it can be handled
        return code
    except BrokenPipeError:
        silence_stdout()
        return EXIT_CLOSED_PIPE


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    _refuse_unknown_leading_flags(parser, sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the command's own parser, so the hint points at its --help
        getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    tolerate_any_terminal()
    configure_logging()
    try:
        return args.handler(args)
    except BrokenPipeError:
        raise  # stdout's reader went away: main() ends quietly, this is no usage error
    except UsageError as exc:
        print(f"looptrace: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ConfigurationError as exc:
        print(f"looptrace: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # e.g. LOOPTRACE_PROMETHEUS_PORT already taken: the environment, not the model
        print(f"looptrace: error: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""),
              file=sys.stderr)
        return EXIT_USAGE


def _refuse_unknown_leading_flags(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """`looptrace --bogus` names the flag it does not know, instead of argparse's "COMMAND is required" (the
    command is missing only because the flag came first)."""
    known = {"-h", "--help", "--version"}
    for argument in argv:
        if not argument.startswith("-"):
            return  # the command: its own parser judges the rest
        if argument not in known:
            parser.error(f"unrecognized arguments: {argument}")


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; each sets ``handler`` (and ``command_parser``, for its own error hints)."""
    parser = Parser(
        prog="looptrace",
        description="An observability-first agent runtime: every run a trace, every loop caught.",
        epilog=EXIT_CODE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"looptrace {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_demo_command(commands)
    add_run_command(commands)
    add_resume_command(commands)
    add_mcp_command(commands)
    add_watch_command(commands)
    add_trace_commands(commands)  # detect, traces show | list | push, report
    add_replay_command(commands)
    return parser


if __name__ == "__main__":
    sys.exit(main())
