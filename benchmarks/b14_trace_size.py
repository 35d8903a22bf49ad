"""13. The trace file's size against what it records (issue 41): recorded public runs replayed through ``Agent``.

Every conversation of a trajectory corpus (``../shared/trajectories``, read in place; ``LOOPTRACE_TRAJECTORIES`` to
point elsewhere) is replayed through a real ``Agent`` with content capture on (the default), writing the trace file
as a user gets it (``configure(exporters="file")``):

* a conversation is one session; each user text message starts a run that continues the conversation so far (as a
  chat application calls ``Agent.run(history)`` once per user message);
* the model is a ``ScriptedModel`` answering with the recorded assistant messages; each tool the conversation calls
  is a ``Tool`` that answers with the recorded result of that call (an error result raises, so it is an error again);
* a run whose recording stops on a tool call (cut off) ends with an empty answer, so that every run ends.

Tool definitions are not in the recordings: each tool is defined from the argument names its calls used, with a
one-line description, so the definitions here are smaller than real ones (tau2's are several KB per domain).

Figures, per corpus:

* **file / content**: the trace file's bytes over the bytes of the GenAI content of the runs, each piece once, in the
  conventions' JSON shape (``{"role", "parts"}`` messages, function tool definitions): per run, every message of its
  conversation (the history it continued, each model response, each tool-result message), its system instructions
  and its tool definitions; per tool call, its arguments and its result (the conventions put them on the call's span
  as well as in the history). Goal: at most 1.5x. What the file holds beyond that is JSON framing, ids, times, the
  other attributes, the resource, and any second copy of the content (a model call's history repeating the calls
  before it, Phoenix's and Langfuse's copies of the same text).
* **bytes per turn**: the trace file's bytes over the model calls made.
* for context, the file over the recordings' own bytes (the conversations as JSON lines).

``python -m benchmarks --only trace-size`` runs it in the table; ``python -m benchmarks.b14_trace_size [--quick]
[--breakdown]`` prints the table and (``--breakdown``) which attribute keys hold the file's bytes.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from looptrace import Agent, configure
from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.settings import Settings
from looptrace.runtime import Limits, ScriptedModel
from looptrace.runtime.tools import Tool

from .common import Row, say
from .detector_eval import corpus_dir

GOAL = 1.5
SYSTEM = "You are a helpful agent. Use the tools to do what the user asks; say plainly when something fails."
# The corpora whose size the issue quotes: customer service and coding agents. (name, conversations in --quick)
CORPORA = (("tau2-sierra", 40), ("openhands-sdk", 4), ("swe-vorflux", 12))


class _Recorded:
    """The recorded results of one conversation's tool calls, handed out in the order the calls are made."""

    def __init__(self) -> None:
        self.results: dict[tuple[str, str], collections.deque[tuple[Any, bool]]] = collections.defaultdict(
            collections.deque)

    def add(self, name: str, arguments: Any, result: Any, is_error: bool) -> None:
        self.results[(name, _key(arguments))].append((result, is_error))

    def answer(self, name: str, arguments: dict[str, Any]) -> Any:
        queue = self.results.get((name, _key(arguments)))
        if not queue:
            return ""
        result, is_error = queue.popleft()
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
        if is_error:
            raise RuntimeError(text)
        return text


def _key(arguments: Any) -> str:
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str)


def _tools(messages: list[dict[str, Any]], recorded: _Recorded) -> list[Tool]:
    """One Tool per tool name the conversation calls, with a schema made of the argument names its calls used."""
    fields: dict[str, dict[str, None]] = {}
    for message in messages:
        for block in message["content"]:
            if block.get("type") == "tool_use":
                arguments = block.get("input")
                names = fields.setdefault(block["name"], {})
                if isinstance(arguments, dict):
                    names.update(dict.fromkeys(arguments))
    tools = []
    for name, names in fields.items():
        schema = {"type": "object", "properties": {field: {"description": f"The {field}."} for field in names}}

        def call(_name: str = name, **arguments: Any) -> Any:
            return recorded.answer(_name, arguments)

        tools.append(Tool(name=name, description=f"The {name.replace('_', ' ')} tool.", input_schema=schema,
                          fn=call))
    return tools


def _runs(messages: list[dict[str, Any]]) -> Iterator[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """(the history a run continues, the responses its model gives) for each user text message."""
    history: list[dict[str, Any]] = []
    run: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None
    for message in messages:
        history.append(message)
        if message["role"] == "user" and any(b.get("type") == "text" for b in message["content"]):
            if run is not None and run[1]:
                yield run
            run = (list(history), [])
        elif message["role"] == "assistant" and run is not None:
            run[1].append(message)
    if run is not None and run[1]:
        yield run


def _scripted(responses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    script = []
    for message in responses:
        blocks = [b for b in message["content"] if b.get("type") in ("text", "tool_use")]
        uses = any(b["type"] == "tool_use" for b in blocks)
        script.append({"stop_reason": "tool_use" if uses else "end_turn", "content": blocks,
                       "usage": {"input_tokens": 100, "output_tokens": 20}})
        if not uses:
            break
    if script and script[-1]["stop_reason"] == "tool_use":  # cut off mid-work: the run ends with an empty answer
        script.append({"stop_reason": "end_turn", "content": [], "usage": {"input_tokens": 100, "output_tokens": 1}})
    return script


def _conversation(record: dict[str, Any]) -> tuple[_Recorded, list[Tool]]:
    recorded = _Recorded()
    calls = {b["id"]: b for m in record["messages"] if m["role"] == "assistant" for b in m["content"]
             if b.get("type") == "tool_use"}
    for message in record["messages"]:
        for block in message["content"]:
            if block.get("type") == "tool_result" and block.get("tool_use_id") in calls:
                call = calls[block["tool_use_id"]]
                recorded.add(call["name"], call.get("input"), block.get("content"), bool(block.get("is_error")))
    return recorded, _tools(record["messages"], recorded)


def replay_corpus(path: Path, limit: int | None, trace_file: Path) -> dict[str, int]:
    """Replays up to ``limit`` conversations of one corpus into ``trace_file``; what was replayed, in numbers."""
    # Never rotated here: the whole corpus is measured in one file.
    telemetry = configure(Settings(trace_file_max_bytes=0), exporters="file", trace_file=trace_file, set_global=False)
    counts = collections.Counter()
    try:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines):
                if limit is not None and number >= limit:
                    break
                record = json.loads(line)
                counts["recorded_bytes"] += len(line.encode())
                recorded, tools = _conversation(record)
                for history, responses in _runs(record["messages"]):
                    script = _scripted(responses)
                    model = ScriptedModel(script)
                    agent = Agent("claude-sonnet-4-5", tools=tools, system=SYSTEM, client=model,
                                  tracer_provider=telemetry.tracer_provider, on_anomaly="warn",
                                  alerts=Alerts(log_warnings=False),
                                  limits=Limits(max_turns=10_000, tool_timeout_s=None))
                    result = agent.run(history, session_id=record["id"][:200])
                    counts["content_bytes"] += content_bytes(model.requests, script[result.turns - 1])
                    counts["runs"] += 1
                    counts["turns"] += result.turns
                counts["conversations"] += 1
    finally:
        telemetry.shutdown()
    return dict(counts)


def content_bytes(requests: list[dict[str, Any]], last_response: dict[str, Any]) -> int:
    """The GenAI content of one run, each piece once (see the module's note): every message of its conversation,
    system instructions, tool definitions, and each tool call's arguments and result."""
    from looptrace.instrumentation.recording.content import genai_message, genai_tool_definition, to_json

    last = requests[-1]
    messages = [*last["messages"], {"role": "assistant", "content": last_response["content"]}]
    size = sum(len(to_json(genai_message(m)).encode()) + 1 for m in messages) + 1
    if last.get("system"):
        size += len(to_json([{"type": "text", "content": last["system"]}]).encode())
    if last.get("tools"):
        size += len(to_json([genai_tool_definition(d) for d in last["tools"]]).encode())
    for message in messages:
        for block in message["content"] if isinstance(message["content"], list) else ():
            if block.get("type") == "tool_use":
                size += len(to_json(block.get("input")).encode())
            elif block.get("type") == "tool_result":
                size += len(to_json(block.get("content")).encode())
    return size


def measure(trace_file: Path) -> dict[str, Any]:
    """The file's bytes (rotated files included) and the bytes per attribute key (its encoded value), resource
    blocks apart, for the breakdown."""
    from looptrace.instrumentation.tracefile.read import read_lines, total_size

    by_key: collections.Counter[str] = collections.Counter()
    for _, data in read_lines(trace_file):
        for resource_spans in data.get("resourceSpans") or ():
            by_key["(resource blocks)"] += len(json.dumps(resource_spans.get("resource") or {},
                                                          separators=(",", ":")))
            for scope_spans in resource_spans.get("scopeSpans") or ():
                for span in scope_spans.get("spans") or ():
                    for item in span.get("attributes") or ():
                        by_key[item["key"]] += len(json.dumps(item, separators=(",", ":"), ensure_ascii=False).encode())
    return {"file_bytes": total_size(trace_file), "by_key": by_key}


def corpora(quick: bool) -> Iterator[tuple[str, Path, int | None]]:
    directory = corpus_dir()
    for name, quick_limit in CORPORA:
        path = directory / f"{name}.jsonl"
        if path.exists():
            yield name, path, quick_limit if quick else None


def run(quick: bool = False, breakdown: bool = False) -> list[Row]:
    rows: list[Row] = []
    found = list(corpora(quick))
    if not found:
        return [Row("13 trace size", "trajectories", "skipped", context=f"no corpus at {corpus_dir()}")]
    with tempfile.TemporaryDirectory(prefix="looptrace-b13-") as tmp:
        for name, path, limit in found:
            trace_file = Path(tmp) / f"{name}.jsonl"
            say(f"  replaying {name}{'' if limit is None else f' (first {limit} conversations)'}")
            counts = replay_corpus(path, limit, trace_file)
            sizes = measure(trace_file)
            ratio = sizes["file_bytes"] / max(counts["content_bytes"], 1)
            per_turn = sizes["file_bytes"] / max(counts["turns"], 1)
            context = (f"{counts['conversations']} conversations, {counts['runs']} runs, {counts['turns']} turns; "
                       f"file {sizes['file_bytes'] / 1e6:.1f} MB, content {counts['content_bytes'] / 1e6:.1f} MB, "
                       f"recordings {counts['recorded_bytes'] / 1e6:.1f} MB "
                       f"(file {sizes['file_bytes'] / max(counts['recorded_bytes'], 1):.1f}x the recordings)")
            rows.append(Row(f"13 trace size: {name}", "file bytes / GenAI content bytes", f"{ratio:.2f}x",
                            f"≤ {GOAL}x", ratio <= GOAL, context))
            rows.append(Row(f"13 trace size: {name}", "file bytes per turn", f"{per_turn / 1e3:.1f} KB",
                            context=f"{counts['turns']} turns"))
            if breakdown:
                say(f"  {name}: bytes by attribute key (encoded key and value), largest first")
                for key, size in sizes["by_key"].most_common(14):
                    say(f"    {size / 1e6:8.2f} MB  {size / sizes['file_bytes']:6.1%}  {key}")
    return rows


def main(argv: list[str] | None = None) -> int:
    from .common import render_table

    parser = argparse.ArgumentParser(prog="python -m benchmarks.b14_trace_size", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few conversations per corpus")
    parser.add_argument("--breakdown", action="store_true", help="print the bytes each attribute key holds")
    args = parser.parse_args(argv)
    os.environ.pop("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", None)
    os.environ.pop("LOOPTRACE_CAPTURE_CONTENT", None)
    print(render_table(run(quick=args.quick, breakdown=args.breakdown)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
