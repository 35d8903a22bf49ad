"""Each message of a run once in the trace file: a model call's input continues what an earlier span of its run holds.

The GenAI conventions put a model call's whole input on its span (``gen_ai.input.messages``), so the spans of a run
repeat its history: the tenth call of a run holds the nine calls' messages again, and the first holds the run's input,
which its root span holds too. That is the shape backends read, and every exporter sends it. The trace file keeps
the same spans with each message once: a call whose input begins with exactly what an earlier span of the run
recorded (the previous call's input followed by its answer, or, for the first call, the run's input on the root) is
written with only the messages after that, and names that span in ``looptrace.chat.input_continues``. A call whose
input does not begin so (a history cut to the size cap, another producer's spans) is written whole.

The rule is textual, so nothing is parsed and nothing is lost: the continued text is the earlier span's recorded text
without its closing bracket (``[m1,m2`` of ``[m1,m2]``; with the previous answer ``[a]`` after it: ``[m1,m2,a``), and
the written input is the rest as a JSON array (``[m3,m4]``, or ``[]``). Once a run's history outgrows the size cap, a
call's input is the newest messages that fit, so it may begin further into the continued text (``[m2,a,m3]``):
``looptrace.chat.input_continues_from`` then says how many characters of it (``m1,``) it leaves out. A window that
moves on keeps each message once too. ``restored_input`` puts it back together, byte for byte. Readers that want a
call's whole input (``traces push``) restore it; the others read the new messages, which is what they were after
anyway (the results a call was sent, the newest user message).

A tool call's description (``gen_ai.tool.description``) is the one its run's tool definitions hold on the root: a
call whose description is exactly that is written without it, and ``traces push`` puts it back from the root.

``HistoryCompactor`` does both as spans are written: the trace file's processor tells it each span as it starts (a
run's root and its turns, so that a call is known to its run) and asks it for the attributes to write as each ends.
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ..recording import semconv as sc

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

__all__ = ["HistoryCompactor", "continued_prefix", "restored_input", "tool_descriptions"]

_MAX_OPEN = 10_000  # runs (and turns) remembered at once: spans that never end must not grow it without bound
_Kept = TypeVar("_Kept")


def plain_attributes(span: ReadableSpan) -> dict[str, Any]:
    """A span's attributes as a dict of its own. The SDK's read-only view of a span's ``BoundedAttributes`` copies
    them with their own ``copy()``, a dict copy in C; ``dict(view)``, ``{**view}`` and every ``view.get`` go through
    the Mapping protocol in Python instead, key by key, which for a model call's two dozen attributes costs more than
    the rest of the compaction."""
    attributes = span.attributes
    if not attributes:
        return {}
    copy = getattr(attributes, "copy", None)
    copied = copy() if callable(copy) else None
    return copied if type(copied) is dict else dict(attributes)


def tool_descriptions(tool_definitions: object) -> Mapping[str, str]:
    """Each tool's description, by name, in a run's recorded ``gen_ai.tool.definitions`` (none when it is cut)."""
    if not isinstance(tool_definitions, str) or not tool_definitions.endswith("]"):
        return {}
    return _parsed_descriptions(tool_definitions)


@functools.lru_cache(maxsize=64)  # an agent's runs record the same definitions, run after run: parsed once
def _parsed_descriptions(tool_definitions: str) -> Mapping[str, str]:
    try:
        definitions = json.loads(tool_definitions)
    except ValueError:
        return {}
    return {str(d["name"]): d["description"] for d in definitions if isinstance(definitions, list)
            and isinstance(d, dict) and d.get("name") is not None and isinstance(d.get("description"), str)}


def continued_prefix(input_messages: str, output_messages: str | None = None) -> str | None:
    """What a later call's input begins with when it continues a span that recorded ``input_messages`` (and, for a
    model call, answered ``output_messages``): the text without its closing bracket. None when the recorded text is
    not a whole JSON array (cut at the size cap) and so cannot be continued."""
    if not (input_messages.startswith("[") and input_messages.endswith("]")):
        return None
    prefix = input_messages[:-1]
    if output_messages is None:
        return prefix
    if not (output_messages.startswith("[") and output_messages.endswith("]")) or output_messages == "[]":
        return None
    return prefix + ("," if len(prefix) > 1 else "") + output_messages[1:-1]


def compacted_input(input_messages: str, prefix: str) -> tuple[str, int] | None:
    """``input_messages`` without what it takes from ``prefix``, as a JSON array, and how many characters of the
    prefix after its ``[`` it leaves out (its window moved on); None when it continues no message of the prefix."""
    if len(prefix) <= 1 or len(input_messages) < 3 or not input_messages.startswith("["):
        return None
    start = _continued_at(input_messages, prefix)
    if start is None:
        return None
    end = 1 + len(prefix) - start  # where the continued part ends in input_messages
    following = input_messages[end] if end < len(input_messages) else ""
    if following == "]" and end == len(input_messages) - 1:
        return "[]", start - 1
    if following == ",":
        return "[" + input_messages[end + 1:], start - 1
    return None


_PROBE = 64  # characters of a call's first message looked for in the text it may continue


def _continued_at(input_messages: str, prefix: str) -> int | None:
    """Where in ``prefix`` the messages ``input_messages`` begins with start (1: the whole prefix; further on: its
    window moved on), at a message boundary, with the whole rest of the prefix matching; None when nowhere."""
    if input_messages.startswith(prefix):
        return 1
    probe = input_messages[1:1 + _PROBE]
    at = prefix.find(probe, 1)
    while at != -1:
        if prefix[at - 1] == "," and input_messages.startswith(prefix[at:], 1):
            return at
        at = prefix.find(probe, at + 1)
    return None


def restored_input(written: str, prefix: str, left_out: int = 0) -> str:
    """A call's whole input again, from what the file holds (``written``), the continued span's prefix and how many
    of its characters the input leaves out (``left_out``)."""
    continued = "[" + prefix[1 + left_out:]
    return continued + "]" if written == "[]" else continued + "," + written[1:]


class _Run:
    __slots__ = ("prefix", "span_id")

    def __init__(self, span_id: int, prefix: str) -> None:
        self.span_id = span_id  # the span whose recorded messages ``prefix`` ends with
        self.prefix = prefix


class HistoryCompactor:
    """Per run, the messages recorded so far (as the prefix text of the next call's input) and the span that holds
    the newest of them. Thread-safe: runs end their spans on their own threads."""

    def __init__(self) -> None:
        self._runs: OrderedDict[int, _Run] = OrderedDict()  # by the run's key: its root span id (or its trace id)
        self._turns: OrderedDict[int, int] = OrderedDict()  # turn span id -> its run's key
        self._descriptions: OrderedDict[int, Mapping[str, str]] = OrderedDict()  # run's key -> its tools' descriptions
        self._lock = threading.Lock()

    def started(self, span: ReadableSpan) -> None:
        """A span started: a run's root registers its input (the first call continues it) and its tools, a turn
        its run."""
        attributes = plain_attributes(span)
        if attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OPERATION_INVOKE_AGENT:
            raw = attributes.get(sc.GEN_AI_INPUT_MESSAGES)
            prefix = continued_prefix(raw) if isinstance(raw, str) else None
            descriptions = tool_descriptions(attributes.get(sc.GEN_AI_TOOL_DEFINITIONS))
            with self._lock:
                if prefix is not None:
                    self._remember(self._runs, span.context.span_id, _Run(span.context.span_id, prefix))
                if descriptions:
                    self._remember(self._descriptions, span.context.span_id, descriptions)
        elif sc.TURN_INDEX in attributes and span.parent is not None:
            with self._lock:
                self._remember(self._turns, span.context.span_id, span.parent.span_id)

    def written(self, span: ReadableSpan) -> Mapping[str, Any] | None:
        """The attributes to write for a span that ended, when they differ from its own (a model call continuing an
        earlier span of its run); None to write the span as it is."""
        attributes = plain_attributes(span)  # a copy of its own: what is written is made from it
        span_id = span.context.span_id
        operation = attributes.get(sc.GEN_AI_OPERATION_NAME)
        if operation == sc.OPERATION_EXECUTE_TOOL:
            return self._without_description(span, attributes)
        if operation != sc.OPERATION_CHAT or attributes.get(sc.JUDGE):
            if sc.TURN_INDEX in attributes or operation == sc.OPERATION_INVOKE_AGENT:
                with self._lock:  # a turn or a run ended: nothing of it is needed any more
                    self._turns.pop(span_id, None)
                    self._runs.pop(span_id, None)
                    self._descriptions.pop(span_id, None)
            return None
        raw, answer = attributes.get(sc.GEN_AI_INPUT_MESSAGES), attributes.get(sc.GEN_AI_OUTPUT_MESSAGES)
        if not isinstance(raw, str):
            return None
        key = self._run_key(span)
        with self._lock:
            run = self._runs.get(key)
            following = continued_prefix(raw, answer if isinstance(answer, str) else None)
            if following is None:
                self._runs.pop(key, None)
            else:
                self._remember(self._runs, key, _Run(span_id, following))
        compacted = compacted_input(raw, run.prefix) if run is not None else None
        if compacted is None or run is None:
            return None
        written, left_out = compacted
        attributes[sc.GEN_AI_INPUT_MESSAGES] = written  # in place of the whole input, where it stood
        attributes[sc.INPUT_CONTINUES] = format(run.span_id, "016x")
        if left_out:
            attributes[sc.INPUT_CONTINUES_FROM] = left_out
        return attributes

    def _without_description(self, span: ReadableSpan, attributes: dict[str, Any]) -> Mapping[str, Any] | None:
        """A tool call's attributes without its description when its run's root holds that very description."""
        description = attributes.get(sc.GEN_AI_TOOL_DESCRIPTION)
        if not isinstance(description, str):
            return None
        with self._lock:
            known = self._descriptions.get(self._turns.get(span.parent.span_id, -1) if span.parent else -1)
        if known is None or known.get(str(attributes.get(sc.GEN_AI_TOOL_NAME))) != description:
            return None
        del attributes[sc.GEN_AI_TOOL_DESCRIPTION]
        return attributes

    def _run_key(self, span: ReadableSpan) -> int:
        """The run of a model call: its turn's run when the turn was seen starting, else its trace."""
        parent = span.parent
        with self._lock:
            key = self._turns.get(parent.span_id) if parent is not None else None
        return key if key is not None else span.context.trace_id

    @staticmethod
    def _remember(table: OrderedDict[int, _Kept], key: int, value: _Kept) -> None:
        table[key] = value
        table.move_to_end(key)
        if len(table) > _MAX_OPEN:
            table.popitem(last=False)


class StoredHistories:
    """The model calls and runs of some traces, as a trace file holds them, to restore the inputs it holds continued
    (``traces push`` sends each call's whole input, as it was made). Fed every span of those traces (``add``, span ids
    in hex), in any order; ``restored`` follows a call's chain of continued spans back to a whole input."""

    def __init__(self) -> None:
        # span id -> (input messages as written, output messages, the span it continues, characters left out of it)
        self._spans: dict[str, tuple[str | None, str | None, str | None, int]] = {}
        self._whole: dict[str, str | None] = {}  # span id -> its whole input, once restored

    def add(self, span_id: str, attributes: Mapping[str, Any]) -> None:
        written, answer = attributes.get(sc.GEN_AI_INPUT_MESSAGES), attributes.get(sc.GEN_AI_OUTPUT_MESSAGES)
        operation = attributes.get(sc.GEN_AI_OPERATION_NAME)
        if operation not in (sc.OPERATION_CHAT, sc.OPERATION_INVOKE_AGENT) or not isinstance(written, str):
            return
        continues, left_out = attributes.get(sc.INPUT_CONTINUES), attributes.get(sc.INPUT_CONTINUES_FROM)
        self._spans[span_id] = (written, answer if operation == sc.OPERATION_CHAT and isinstance(answer, str)
                                else None, continues if isinstance(continues, str) else None,
                                left_out if type(left_out) is int and left_out > 0 else 0)

    def restored(self, span_id: str) -> str | None:
        """The whole input of a span (``span_id``), or None when a span of its chain is missing or does not match."""
        chain = []
        current: str | None = span_id
        while current is not None and current not in self._whole:
            entry = self._spans.get(current)
            if entry is None or current in chain:  # not in the traces read, or a loop in a damaged file
                return None
            chain.append(current)
            current = entry[2]
        whole = self._whole.get(current) if current is not None else None
        for link in reversed(chain):
            written, _, continues, left_out = self._spans[link]
            if continues is None:
                whole = written
            elif whole is None or written is None:
                break
            else:
                earlier_answer = self._spans[continues][1]
                prefix = continued_prefix(whole, earlier_answer)
                whole = restored_input(written, prefix, left_out) if prefix is not None else None
            self._whole[link] = whole
        return self._whole.get(span_id)
