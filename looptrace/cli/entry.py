"""The `looptrace` command: the trace commands start without loading the agent runtime; the rest load it all."""

from __future__ import annotations

import sys

TRACE_COMMANDS = ("detect", "traces", "report")


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] and arguments[0] in TRACE_COMMANDS:
        from looptrace.cli.trace_commands import main as trace_main

        return trace_main(arguments)
    from looptrace.cli.app import main as full_main

    return full_main(arguments)


if __name__ == "__main__":
    sys.exit(main())
