"""`looptrace resume STATE --approve ID --reject ID=REASON`: finish a run that paused for a person's decision.

The state file says which agent to build again (the `run` flags it was started with, its tools file included), and
the flags bring the decisions: every pending call approved or rejected, or, for a run paused by an anomaly whose
policy says "ask", --go-on (with an optional --message for the model) or --stop. Anything wrong with the state or the
decisions is one line and exit code 2, with nothing run.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from looptrace.cli.common import UsageError
from looptrace.cli.exit_codes import exit_code_help
from looptrace.cli.running import add_export_flags, export_overrides


def add_resume_command(commands: Any) -> None:
    resume = commands.add_parser("resume", help="finish a run that paused for a person's decision",
                                 epilog=exit_code_help("resume"), formatter_class=argparse.RawDescriptionHelpFormatter)
    resume.add_argument("state", type=Path, help="the state file the paused run wrote")
    resume.add_argument("--approve", action="append", default=[], metavar="ID",
                        help="approve the pending call ID; repeat for more")
    resume.add_argument("--reject", action="append", default=[], metavar="ID=REASON",
                        help="reject the pending call ID; the model reads REASON; repeat for more")
    resume.add_argument("--go-on", action="store_true", help="a run paused by an anomaly goes on")
    resume.add_argument("--message", help="with --go-on: a message the model receives")
    resume.add_argument("--stop", action="store_true", help="a run paused by an anomaly stops")
    resume.add_argument("--approve-tool", action="append", default=[], metavar="TOOL",
                        help="in the resumed run, approve every new call of TOOL without asking")
    resume.add_argument("--json", action="store_true", help="print the RunResult as one JSON object, nothing else")
    from looptrace.cli.run_command import add_approval_flags

    add_approval_flags(resume)
    add_export_flags(resume)
    resume.set_defaults(command_parser=resume, handler=resume_command)


def resume_command(args: argparse.Namespace) -> int:
    from looptrace.cli.environment import check_anthropic_environment, read_settings
    from looptrace.cli.offline_model import is_scripted
    from looptrace.cli.run_command import (
        build_agent,
        check_approved_tools,
        load_tools,
        report,
        resume_run,
        settle_asked,
        terminal_approver,
    )
    from looptrace.instrumentation.export import configure
    from looptrace.runtime import MCPServerUnavailable, RunState, StateError, claims_directory

    decisions = _decisions(args)
    environment = read_settings(**export_overrides(args))
    try:  # a paused run resumed already is refused here, before its tools are imported or its servers started
        state = RunState.load(args.state, claims=claims_directory(environment.state_home))
    except StateError as exc:
        raise UsageError(str(exc)) from None
    options = state.app.get("cli")
    if not isinstance(options, dict):
        raise UsageError(f"{args.state} was not written by `looptrace run`: resume it from the application that "
                         "paused it (Agent.resume)")
    _check_options(args.state, options)
    settings = environment.with_overrides(model=options.get("model") or state.model)
    if not is_scripted(settings.model):
        check_anthropic_environment()
    tools = load_tools(Path(options["tools"])) if options.get("tools") else []
    check_approved_tools(args.approve_tool, tools, has_servers=bool(options.get("mcp") or options.get("mcp_url")))
    telemetry = configure(settings)
    approver = terminal_approver(args, approve_tools=args.approve_tool)
    try:
        try:
            agent = build_agent(options, tools, settings, telemetry, approver, json_output=args.json)
        except (TypeError, ValueError, KeyError) as exc:  # the options were edited or damaged: said, nothing run
            raise UsageError(f"{args.state}: the `looptrace run` options it records cannot build the agent "
                             f"({type(exc).__name__}: {str(exc).strip(chr(34))}); the state is kept") from None
        result = resume_run(agent, state, telemetry, **decisions)
    except (StateError, ValueError, KeyError) as exc:
        telemetry.shutdown()
        raise UsageError(str(exc).strip('"')) from None
    except MCPServerUnavailable as exc:  # before the resumed run began: its claim was taken back
        telemetry.shutdown()
        raise UsageError(f"{exc}; the run state is kept: resume it again once the server starts") from None
    except UsageError:
        telemetry.shutdown()
        raise
    result = settle_asked(agent, result, approver, telemetry)
    args.tools = options.get("tools")
    return report(args, telemetry, result, options)


# What `looptrace run` records of its flags (run_command.agent_options), by the type each must have.
_WHOLE, _NUMBER, _TEXT, _FLAG, _LINES = "a whole number", "a number", "text", "true or false", "a list of text"
_OPTION_TYPES = {"tools": _TEXT, "model": _TEXT, "system": _TEXT, "name": _TEXT, "on_anomaly": _TEXT,
                 "max_tokens": _WHOLE, "max_turns": _WHOLE, "max_total_tokens": _WHOLE, "max_cost_usd": _NUMBER,
                 "max_loop_cost_usd": _NUMBER, "timeout": _NUMBER, "tool_timeout": _NUMBER, "stream": _FLAG,
                 "mcp": _LINES, "mcp_url": _LINES}


def _check_options(path: Path, options: dict[str, Any]) -> None:
    """A usage error naming the first recorded flag whose value is not of its type (a state edited by hand, or
    damaged): said in one line before anything is built, and the state is left as it was."""
    for name, kind in _OPTION_TYPES.items():
        value = options.get(name)
        if value is None or _is(value, kind):
            continue
        raise UsageError(f"{path}: the recorded `looptrace run` option {name} is {value!r:.60}, not {kind}; the "
                         "state is damaged or was edited (nothing was run, the state is kept)")


def _is(value: Any, kind: str) -> bool:
    if kind == _TEXT:
        return isinstance(value, str)
    if kind == _FLAG:
        return isinstance(value, bool)
    if kind == _LINES:
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (kind == _NUMBER and isinstance(value, float))


def _decisions(args: argparse.Namespace) -> dict[str, Any]:
    rejected: dict[str, str] = {}
    for item in args.reject:
        call_id, sep, reason = item.partition("=")
        if not sep or not call_id or not reason.strip():
            raise UsageError(f"--reject takes ID=REASON (the model reads the reason), got {item!r}")
        rejected[call_id] = reason
    if args.go_on and args.stop:
        raise UsageError("--go-on and --stop: choose one")
    if args.message is not None and not args.go_on:
        raise UsageError("--message goes with --go-on")
    go_on = True if args.go_on else False if args.stop else None
    decisions: dict[str, Any] = {"approve": list(args.approve), "reject": rejected}
    if go_on is not None:
        decisions["go_on"] = go_on
        if args.message is not None:
            decisions["message"] = args.message
    return decisions
