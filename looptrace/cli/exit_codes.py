"""The exit codes, part of the interface (scripts branch on them): listed here and, for people, in ``--help``.

Standard library only, like everything the trace commands import: `looptrace detect` starts without the runtime.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_USAGE = 2  # bad flags, a tools file that does not import, a missing key, an unreadable trace file
EXIT_NOT_FOUND = 3  # traces show: no such trace
EXIT_AWAITING_APPROVAL = 40  # the run paused for a person's decision; its state file resumes it
EXIT_INTERRUPTED = 130
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: what a shell reports for any program whose reader went away (`| head`)
EXIT_TERMINATED = 143  # 128 + SIGTERM, as shells report it

EXIT_CODE_HELP = """exit codes:
  0   done (the model ended its turn)       1   error (the API call failed, see the message)
  2   usage: bad flag, tools file, missing key or unreadable file
  3   traces show: no such trace
  10  max_turns    11 token_budget    12 cost_budget    13 timeout    14 loop_budget
  20  max_tokens   21 stop_sequence   22 refusal        23 context_window
  30  stopped_by_detector             130 interrupted (Ctrl-C)   143 terminated (SIGTERM)
  40  awaiting_approval: paused for a person's decision (resume with `looptrace resume STATE`)
  141 stdout closed early (e.g. `| head`): the run finished and its trace was saved"""
