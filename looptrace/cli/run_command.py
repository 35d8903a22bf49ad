"""`looptrace run TASK --tools FILE.py`: an agent on the real Messages API, with the @tool functions of a file."""

from __future__ import annotations

import argparse
import sys
import traceback
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from looptrace.cli.common import UsageError, is_terminal
from looptrace.cli.environment import check_anthropic_environment, no_trace_file_reason, read_settings
from looptrace.cli.exit_codes import exit_code_help
from looptrace.cli.mcp_command import add_mcp_flags, servers_from
from looptrace.cli.running import (
    EXIT_CODES,
    add_anomaly_flag,
    add_export_flags,
    close,
    deliver_outcome,
    execute,
    export_overrides,
    print_json,
    telemetry_options,
)
from looptrace.instrumentation import DEFAULT_MODEL

if TYPE_CHECKING:
    from looptrace.cli.approval_prompt import TerminalApprover
    from looptrace.instrumentation.export import Telemetry
    from looptrace.runtime import Agent, RunResult, Tool


def add_run_command(commands: Any) -> None:
    """Add `run` to a subparsers object."""
    run = commands.add_parser("run", help="run an agent on a task with the tools in a Python file",
                              epilog=exit_code_help("run"), formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("task", help="what the agent should do")
    run.add_argument("--tools", metavar="FILE.py", help="a Python file; every @tool function in it is offered")
    add_mcp_flags(run)
    run.add_argument("--model", help=f"model id (default: LOOPTRACE_MODEL, else {DEFAULT_MODEL}); "
                                     "scripted:equipment, scripted:notes or scripted:FILE.json replay written "
                                     "responses offline, no key needed (docs/cli.md)")
    run.add_argument("--system", help="system prompt")
    run.add_argument("--name", default="agent", help="agent name on spans and metrics (default: %(default)s)")
    run.add_argument("--max-tokens", type=_positive_int, default=4096, help="max_tokens per model call")
    run.add_argument("--max-turns", type=_positive_int, default=10, help="model calls at most (default: %(default)s)")
    run.add_argument("--max-total-tokens", type=_positive_int, help="token budget, cache tokens included")
    run.add_argument("--max-cost-usd", type=_positive_float, help="cost budget in USD")
    run.add_argument("--max-loop-cost-usd", type=_positive_float,
                     help="what one loop may burn, in USD: a run whose current loop (an anomaly's streak, from its "
                          "first repeated turn) costs more stops there with status loop_budget, whatever --on-anomaly "
                          "says")
    run.add_argument("--timeout", type=_positive_float, help="wall-clock limit for the run, seconds")
    run.add_argument("--tool-timeout", type=_positive_float, default=60.0,
                     help="per tool call, seconds (default: %(default)s)")
    run.add_argument("--judge", metavar="MODEL",
                     help="a model that confirms ignored_error before it is reported, asked through the run's own "
                          "client (default: LOOPTRACE_JUDGE, else no judge; LOOPTRACE_JUDGE_MAX_CALLS calls per run "
                          "at most, default 3); its cost is shown apart, never charged to the run")
    run.add_argument("--stream", action="store_true",
                     help="use server-sent events for model calls; the model's text is shown as it arrives")
    run.add_argument("--json", action="store_true", help="print the RunResult as one JSON object, nothing else")
    run.add_argument("--session-id", help="Langfuse session (and gen_ai.conversation.id) of the run's trace")
    run.add_argument("--user-id", help="Langfuse user of the run's trace")
    run.add_argument("--tag", action="append", default=[], metavar="TAG", help="a trace tag; repeat for more")
    run.add_argument("--traceparent",
                     help="W3C traceparent of a trace to join (default: TRACEPARENT), e.g. from a job scheduler")
    add_approval_flags(run)
    run.add_argument("--approve", action="append", default=[], metavar="TOOL",
                     help="approve every call of TOOL without asking; repeat for more")
    add_anomaly_flag(run)
    add_export_flags(run)
    run.set_defaults(command_parser=run, handler=run_command)


def add_approval_flags(parser: argparse.ArgumentParser) -> None:
    """What `run` and `resume` share about calls that need approval."""
    parser.add_argument("--approve-all", action="store_true",
                        help="approve every call that needs approval without asking")
    parser.add_argument("--state-file", type=Path, metavar="PATH",
                        help="where a run that pauses for a decision (stdin is no terminal) writes its state "
                             "(default: .looptrace/paused/TRACE_ID.json); `looptrace resume PATH` finishes it")


def run_command(args: argparse.Namespace) -> int:
    """Run the agent on the task; the final answer on stdout, the live view and where the trace went on stderr."""
    from opentelemetry import context as otel_context

    from looptrace.cli.offline_model import is_scripted, scripted_model
    from looptrace.instrumentation.export import configure, context_from_traceparent
    from looptrace.instrumentation.recording import checked, run_labels
    from looptrace.runtime import MCPServerUnavailable

    if not args.task.strip():
        raise UsageError("the task is empty: say what the agent should do, e.g. looptrace run \"Summarise README.md\"")
    # An empty --model or --traceparent is as good as none: the environment's (or the default) value stays.
    settings = read_settings(**export_overrides(args), model=args.model or None,
                             traceparent=args.traceparent or None, judge=args.judge or None)
    if is_scripted(settings.model):
        scripted_model(settings.model)  # a script that cannot be read is said before anything else
    else:
        check_anthropic_environment()
    options = agent_options(args)
    tools = load_tools(Path(args.tools)) if args.tools else []
    check_approved_tools(args.approve, tools, has_servers=bool(args.mcp or args.mcp_url))
    servers = servers_from(args)  # a bad --mcp line is a usage error before anything starts
    _check_priced(settings.model, args.max_cost_usd)
    _check_priced(settings.model, args.max_loop_cost_usd, "--max-loop-cost-usd")
    if not tools and not servers:
        print("looptrace: no --tools FILE.py given: the model runs with no tools", file=sys.stderr)
    if args.traceparent:
        try:
            parent = context_from_traceparent(settings.traceparent, settings.tracestate)
        except ValueError as exc:
            raise UsageError(f"--traceparent: {exc}") from None
    else:
        # From TRACEPARENT, which a scheduler sets for every process it starts: a bad one costs a warning naming it,
        # and the run goes ahead in a trace of its own (the library's rule for the variable).
        parent = context_from_traceparent(settings=settings)
    telemetry = configure(settings)
    approver = terminal_approver(args, approve_tools=args.approve)
    try:
        agent = build_agent(options, tools, settings, telemetry, approver, json_output=args.json)
        labels = {"session_id": args.session_id, "user_id": args.user_id, "tags": args.tag}
        checked("agent name", args.name)  # a label a backend would drop is a usage error, said before the run
        run_labels(**labels)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    token = otel_context.attach(parent) if parent is not None else None
    try:
        result = execute(agent, args.task, telemetry, labels)
        result = settle_asked(agent, result, approver, telemetry)
    except MCPServerUnavailable as exc:  # said before the run began: nothing was asked of the model
        close(telemetry)
        raise UsageError(str(exc)) from None
    finally:
        if token is not None:
            otel_context.detach(token)
    return report(args, telemetry, result, options)


def report(args: argparse.Namespace, telemetry: Telemetry, result: RunResult, options: dict[str, Any]) -> int:
    """The outcome on stdout, where the trace went on stderr, and a paused run's state file and the command that
    resumes it; then everything delivered. Returns the exit code."""
    try:
        if result.state is not None:
            _write_state(args, result, options)
        if args.json:
            deliver_outcome(lambda: print_json(result, sys.stdout))
        else:
            if result.final_text:
                deliver_outcome(lambda: print(result.final_text))
            if result.error:
                print(f"looptrace: {result.status.value}: {result.error}", file=sys.stderr)
            _point_at_trace(telemetry, result, sys.stderr, "--exporter" if args.exporter else None)
    finally:
        close(telemetry)  # whatever happens to stdout, the spans are delivered or listed as undelivered
    return EXIT_CODES[result.status]


def agent_options(args: argparse.Namespace) -> dict[str, Any]:
    """What builds the run's agent, as JSON data: a paused run's state keeps it, so `looptrace resume` builds the
    same agent again."""
    return {"tools": str(Path(args.tools).resolve()) if args.tools else None, "model": args.model or None,
            "system": args.system, "name": args.name, "max_tokens": args.max_tokens, "max_turns": args.max_turns,
            "max_total_tokens": args.max_total_tokens, "max_cost_usd": args.max_cost_usd,
            "max_loop_cost_usd": args.max_loop_cost_usd, "timeout": args.timeout,
            "tool_timeout": args.tool_timeout, "stream": args.stream, "on_anomaly": args.on_anomaly,
            "mcp": list(args.mcp), "mcp_url": list(args.mcp_url), "mcp_connect_timeout": args.mcp_connect_timeout}


def build_agent(options: dict[str, Any], tools: list[Tool], settings: Any, telemetry: Telemetry,
                approver: TerminalApprover, *, json_output: bool) -> Agent:
    """The run's agent, from its options (a paused run's state keeps them); the approver pauses the live view while
    it asks."""
    from looptrace.cli.offline_model import is_scripted, scripted_model
    from looptrace.cli.views import LiveView
    from looptrace.runtime import Agent, AnthropicModel, Limits

    servers = servers_from(argparse.Namespace(mcp=options.get("mcp") or [], mcp_url=options.get("mcp_url") or [],
                                              mcp_connect_timeout=options.get("mcp_connect_timeout")))
    client = (scripted_model(settings.model, stream=options["stream"]) if is_scripted(settings.model)
              else AnthropicModel(stream=options["stream"]))
    view = None if json_output else LiveView(sys.stderr, capture_content=settings.capture_content)
    approver.view = view
    return Agent(
        settings.model, tools=tools, mcp_servers=servers, system=options["system"], name=options["name"],
        max_tokens=options["max_tokens"], client=client, on_anomaly=options["on_anomaly"], approver=approver,
        limits=Limits(max_turns=options["max_turns"], max_total_tokens=options["max_total_tokens"],
                      max_cost_usd=options["max_cost_usd"], max_loop_cost_usd=options.get("max_loop_cost_usd"),
                      timeout_s=options["timeout"],
                      tool_timeout_s=options["tool_timeout"]),
        on_event=view, **telemetry_options(telemetry, live_view=not json_output),
    )


def check_approved_tools(approved: list[str], tools: list[Tool], *, has_servers: bool) -> None:
    """`--approve TOOL` names a tool the run offers: a misspelt name would otherwise approve nothing, silently, and
    the run would stop to ask (or pause) all the same. With MCP servers, the names of their tools are known only once
    they have started, so the names are not checked then."""
    if has_servers:
        return
    known = {tool.name for tool in tools}
    unknown = [name for name in approved if name not in known]
    if unknown:
        offered = f"its tools: {', '.join(sorted(known))}" if known else "it offers no tools (no --tools FILE.py)"
        raise UsageError(f"--approve {unknown[0]}: the run has no tool of that name ({offered})")


def terminal_approver(args: argparse.Namespace, approve_tools: list[str]) -> TerminalApprover:
    """Asks at the terminal when stdin is one; otherwise decides only what the flags approve, and the run pauses."""
    from looptrace.cli.approval_prompt import TerminalApprover

    return TerminalApprover(sys.stdin, sys.stderr, approve_tools=approve_tools, approve_all=args.approve_all,
                            ask=is_terminal(sys.stdin))


def settle_asked(agent: Agent, result: RunResult, approver: TerminalApprover, telemetry: Telemetry) -> RunResult:
    """A run paused on an anomaly that asks: with a person at the terminal, their answer resumes it at once."""
    while approver.ask and result.state is not None and result.pending_anomaly is not None:
        go_on, message = approver.go_on(result)
        result = resume_run(agent, result.state, telemetry, go_on=go_on, message=message)
    return result


def resume_run(agent: Agent, state: Any, telemetry: Telemetry, **decisions: Any) -> RunResult:
    """``agent.resume`` under the same Ctrl-C and SIGTERM handling as a run."""
    return execute(agent, None, telemetry, resume=(state, decisions))


def _write_state(args: argparse.Namespace, result: RunResult, options: dict[str, Any]) -> None:
    state = result.state
    assert state is not None
    state.app["cli"] = options
    path = args.state_file or Path(".looptrace") / "paused" / f"{result.trace_id}.json"
    state.save(path)  # missing folders made 0700: the state holds the conversation
    waiting = [f"  {p.call_id}  {p.tool}({short_arguments(p.arguments)})" for p in result.pending]
    decisions = " ".join(f"--approve {p.call_id}" for p in result.pending) or "--go-on"
    asked = result.pending_anomaly
    what = (f"{len(result.pending)} call(s) wait for approval:\n" + "\n".join(waiting) if result.pending else
            f"a {asked.type} anomaly asks whether to go on: {asked.message}" if asked is not None else "")
    print(f"looptrace: the run paused; {what}\nstate written to {path}; resume it with:\n"
          f"  looptrace resume {path} {decisions}\n"
          f"  (or --reject ID=REASON per call; --go-on [--message TEXT] or --stop for an anomaly)", file=sys.stderr)


def short_arguments(arguments: Any) -> str:
    from looptrace.cli.approval_prompt import shown_arguments

    text = shown_arguments(arguments)
    return text if len(text) <= 200 else text[:199] + "…"


MAX_TOOLS_FILE_BYTES = 16 << 20  # a tools file is source code: beyond this, it is the wrong file (or /dev/zero)


def _check_priced(model: str, max_cost_usd: float | None, flag: str = "--max-cost-usd") -> None:
    """A cost budget needs the model's price. The library's answer (pass ``prices=``) is not one a command line can
    take, so the CLI says what it can do instead."""
    from looptrace.runtime import price_for

    if max_cost_usd is None or price_for(model) is not None:
        return
    raise UsageError(f"{flag} needs the price of model {model!r}, and looptrace's price table has none: "
                     f"give a model it prices (--model or LOOPTRACE_MODEL, e.g. {DEFAULT_MODEL}), or drop "
                     f"{flag} and bound the run with --max-total-tokens instead")


def load_tools(path: Path) -> list[Tool]:
    """Every @tool in a Python file, in the order the file defines them.

    The file is read as Python source whatever its name or kind (a pipe, /dev/null), at most
    ``MAX_TOOLS_FILE_BYTES`` of it; whatever goes wrong while it runs, exiting included, is one line naming it.
    """
    from looptrace.runtime import Tool

    module = types.ModuleType(f"looptrace_tools_{path.stem}")
    module.__file__ = str(path)
    source = _tools_source(path)
    try:
        code = compile(source, str(path), "exec", dont_inherit=True)
        exec(code, module.__dict__)  # running the user's own tools file is the point of --tools
    except SystemExit as exc:  # sys.exit() at import: its code must not become the CLI's (3 means "no such trace")
        how = (f"with code {exc.code}" if isinstance(exc.code, int) else
               "with code 0" if exc.code is None else f"saying {short_text(exc.code)}")
        raise UsageError(f"tools file {path}{_where(path, exc)} exited {how} while importing; a tools file should "
                         "only define @tool functions") from None
    except Exception as exc:  # whatever the file does wrong, the user gets one line naming it
        where = _where(path, exc)
        raise UsageError(f"cannot import tools file {path}{where}: {type(exc).__name__}: {exc}") from None
    found = [value for value in vars(module).values() if isinstance(value, Tool)]
    if not found:
        raise UsageError(f"{path} defines no @tool functions")
    return found


def _tools_source(path: Path) -> bytes:
    """The bytes of a tools file, read within the bound; what cannot be read is a usage error."""
    if path.is_dir():
        raise UsageError(f"--tools {path} is a directory; give the Python file that defines the @tool functions")
    if not path.exists():
        raise UsageError(f"tools file {path} does not exist")
    try:
        with open(path, "rb") as handle:
            source = handle.read(MAX_TOOLS_FILE_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read tools file {path}: {exc.strerror or exc}") from None
    if len(source) > MAX_TOOLS_FILE_BYTES:
        raise UsageError(f"tools file {path} is larger than {MAX_TOOLS_FILE_BYTES >> 20} MiB; is it a Python file?")
    return source


def short_text(value: object, limit: int = 200) -> str:
    """A value quoted on one line, cut at ``limit`` characters."""
    text = " ".join(str(value).split())
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def _where(path: Path, exc: BaseException) -> str:
    line = _line_in(path, exc)
    return f" (line {line})" if line else ""


def _line_in(path: Path, exc: BaseException) -> int | None:
    """The line of the tools file where importing it failed: the syntax error's, or the deepest frame in that file."""
    if isinstance(exc, SyntaxError) and exc.lineno and Path(exc.filename or "").resolve() == path.resolve():
        return exc.lineno
    line = None
    target = str(path.resolve())
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if str(Path(frame.f_code.co_filename).resolve()) == target:
            line = lineno
    if line is None and isinstance(exc, SyntaxError):
        return exc.lineno
    return line


def _point_at_trace(telemetry: Telemetry, result: RunResult, out: TextIO, chosen_by: str | None = None) -> None:
    """The end of every run: its trace id, where to look at it locally, and its link in Langfuse when there is one."""
    if telemetry.settings.telemetry_disabled:
        out.write(f"no trace: {no_trace_file_reason(telemetry, chosen_by)}\n")
        return
    where = (f" written to {telemetry.trace_file}; see it with: looptrace traces show --trace-id {result.trace_id[:12]}"
             if telemetry.trace_file is not None else "")
    out.write(f"trace {result.trace_id}{where}\n")
    if result.trace_url:
        out.write(f"trace in Langfuse: {result.trace_url}\n")


# argparse words a failed conversion after the function's name ("invalid _positive_int value"): these say it in
# the user's terms instead.


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value
