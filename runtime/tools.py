"""Tools the model can call: schema from a typed, documented function; validation; results as the model reads them.

`@tool` reads a function's signature and docstring once, at decoration, and builds both the JSON schema the model
sees and a pydantic validator for the arguments it sends back. Validation is strict JSON validation: the model is
shown "integer", so "5" is an error it can correct, not something we silently coerce. Running a call, under its
time limit, is ``tool_threads``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeAlias, get_type_hints

import pydantic

from looptrace.instrumentation.interface import redact

NeedsApproval: TypeAlias = "bool | Callable[[dict[str, Any]], bool | Awaitable[bool]]"
"""Whether a tool's calls wait for a decision: always (True), never (False), or as a predicate over the validated
arguments says (its answer may be awaitable)."""

NO_RESULT = "(the tool returned no result)"
EMPTY_RESULT = "(the tool returned an empty string)"
_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class ToolError(Exception):
    """A tool call that could not produce a result. Its message goes back to the model as an is_error tool_result."""

    kind = "error"


class InvalidArguments(ToolError):
    kind = "invalid_arguments"


class UnknownTool(ToolError):
    kind = "unknown_tool"


class ToolTimeout(ToolError):
    kind = "timeout"


class ToolRaisedBaseException(ToolError):
    """A tool raised KeyboardInterrupt, SystemExit or the like. It is that tool's failure: re-raised as it is, it would
    look like the user pressing Ctrl-C, or end the process."""

    def __init__(self, original: BaseException) -> None:
        text = _safe_text(original)
        super().__init__(f"{type(original).__name__}: {text}" if text else type(original).__name__)
        self.original = original


@dataclasses.dataclass(frozen=True)
class Tool:
    """A callable offered to the model. Build one with `@tool`; construct directly only for hand-written schemas.

    ``needs_approval`` makes a person (or ``Agent(approver=...)``) decide each call before it runs: ``True`` for every
    call, or a predicate over the call's validated arguments (sync or async) that says whether this one needs it.
    The loop reads nothing else, so a Tool built by any source (a hand-written schema, a server's tool list) gets the
    same approval flow.
    """

    name: str
    description: str
    input_schema: dict[str, Any]
    fn: Callable[..., Any]
    arguments_model: type[pydantic.BaseModel] | None = None
    needs_approval: NeedsApproval = False

    @functools.cached_property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def definition(self) -> dict[str, Any]:
        """The entry for the Messages API `tools` parameter."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}

    def validate(self, arguments: object) -> dict[str, Any]:
        """Keyword arguments for `fn`, or InvalidArguments naming each field that is wrong and why."""
        if not isinstance(arguments, Mapping):
            # Quoted back redacted: this message lands on spans, in anomaly messages and in the model's history.
            raise InvalidArguments(
                f"{self.name} takes a JSON object of arguments, got {type(arguments).__name__}: "
                f"{_short(json.dumps(redact(arguments), ensure_ascii=False, default=str, separators=(',', ':')))}"
            )
        if self.arguments_model is None:
            return dict(arguments)
        try:
            parsed = self.arguments_model.model_validate_json(json.dumps(_json_integers(arguments)), strict=True)
        except pydantic.ValidationError as exc:
            raise InvalidArguments(_explain(self.name, exc)) from None
        except (RecursionError, ValueError) as exc:  # nested too deep to encode, or a number too long to write out
            raise InvalidArguments(f"invalid arguments for {self.name}: they cannot be read ({type(exc).__name__}); "
                                   f"send plain, shallow JSON") from None
        # Keep pydantic models and enums as the function declared them; only fields the model sent are passed, so
        # the function's own defaults apply to the rest.
        return {name: getattr(parsed, name) for name in parsed.model_fields_set}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """A decorated tool stays callable as the plain function it wraps."""
        return self.fn(*args, **kwargs)


def tool(fn: Callable[..., object] | None = None, *, name: str | None = None, description: str | None = None,
         needs_approval: NeedsApproval = False):
    """Offer a typed, documented function to the model.

    The name is the function's, the description its docstring's text before the parameter section, and each
    parameter's description its entry in that section (Google, NumPy or Sphinx style). Parameters with defaults are
    optional. Usable bare or with arguments: ``@tool`` or ``@tool(name="search", description="...")``.
    ``needs_approval=True`` (or a predicate over the validated arguments) holds each call for a decision (see Tool).
    """
    if not (isinstance(needs_approval, bool) or callable(needs_approval)):
        raise TypeError(f"needs_approval must be True, False or a callable, got {type(needs_approval).__name__}")

    def build(func: Callable[..., object]) -> Tool:
        summary, param_docs = _parse_docstring(inspect.getdoc(func) or "")
        tool_name = name or func.__name__
        if not _NAME_PATTERN.match(tool_name):
            raise ValueError(f"tool name {tool_name!r} must match {_NAME_PATTERN.pattern} (the Messages API's rule)")
        model = _arguments_model(func, param_docs)
        return Tool(
            name=tool_name,
            description=description or summary or tool_name,
            input_schema=_schema_of(model),
            fn=func,
            arguments_model=model,
            needs_approval=needs_approval,
        )

    return build if fn is None else build(fn)


def as_tools(items: Iterable[Tool | Callable[..., object]] | None) -> dict[str, Tool]:
    """Tools by name from Tool objects or plain functions (decorated on the fly); duplicate names are an error."""
    tools: dict[str, Tool] = {}
    for item in items or ():
        t = item if isinstance(item, Tool) else tool(item)
        if t.name in tools:
            raise ValueError(f"two tools are named {t.name!r}")
        tools[t.name] = t
    return tools


# --- results ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ContentBlocks:
    """A result made of Messages API content blocks (text, image, document), as an MCP server's tool returns it.

    The model is sent the blocks; spans, events and the detector see ``text``: the text blocks as they are and every
    other block as a one-line placeholder, so an image never lands in a trace.
    """

    blocks: Sequence[dict[str, Any]]

    @functools.cached_property
    def text(self) -> str:
        parts = [block.get("text", "") if block.get("type") == "text" else _placeholder(block) for block in self.blocks]
        return "\n".join(parts) or EMPTY_RESULT

    def message_content(self, limit: int, truncate: Callable[[str, int], str]) -> list[dict[str, Any]]:
        """The tool_result content, each text block held to ``limit`` characters as a plain result is."""
        return [{**block, "text": truncate(block.get("text", ""), limit)} if block.get("type") == "text"
                else dict(block) for block in self.blocks]


def _placeholder(block: Mapping[str, Any]) -> str:
    source = block.get("source")
    if isinstance(source, Mapping):
        size = len(source.get("data") or "")
        return f"[{block.get('type')}: {source.get('media_type', '?')}, {size:,} characters of base64]"
    return f"[{block.get('type')} block]"


class UnreadableResult(ToolError):
    """A tool returned a value that cannot be written as text (nested too deep, circular, a number too long to print,
    keys JSON has no form for, an object whose own text fails). The model is told what came back instead."""


def result_text(value: object) -> str:
    """The tool_result content for a return value: strings as they are, everything else as JSON.

    Raises UnreadableResult, never anything else: a return value is the tool's business and must not end the run.
    """
    if value is None:
        return NO_RESULT
    if isinstance(value, ContentBlocks):
        return value.text
    if isinstance(value, str):
        return value or EMPTY_RESULT
    try:
        return json.dumps(value, ensure_ascii=False, default=_jsonable)
    except (RecursionError, ValueError, TypeError) as exc:
        reason = {RecursionError: "it is nested too deep", TypeError: "it holds keys or values JSON cannot express"
                  }.get(type(exc), _value_error_reason(exc))
    except Exception as exc:  # whatever a returned object's own __str__ or __json__ machinery raises
        reason = f"converting it raised {type(exc).__name__}"
    raise UnreadableResult(f"the tool returned a {_type_name(value)} that cannot be sent as text: {reason}")


def _value_error_reason(exc: BaseException) -> str:
    text = _safe_text(exc)
    if "Circular reference" in text:
        return "it contains itself"
    if "integer string conversion" in text or "digits" in text:
        return "it holds an integer too long to write out"
    return f"converting it raised {type(exc).__name__}"


def _type_name(value: object) -> str:
    return type(value).__qualname__


def _safe_text(value: object) -> str:
    try:
        return str(value)
    except Exception:
        return ""


def _jsonable(value: object) -> object:
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    # Dates, paths, decimals, enums and anything else: its text, so the model still sees something meaningful.
    return str(value)


def error_text(exc: BaseException) -> str:
    """What the model is told when a tool raised: the exception's type and message."""
    if isinstance(exc, ToolError):
        return _safe_text(exc)
    message = _safe_text(exc)  # a tool's own exception may fail to describe itself too
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


# --- schema building ----------------------------------------------------------------------------------------------


def _arguments_model(func: Callable[..., object], param_docs: dict[str, str]) -> type[pydantic.BaseModel]:
    hints = get_type_hints(func, include_extras=True)
    fields: dict[str, Any] = {}
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, pydantic.Field(default, description=param_docs.get(param.name)))
    config = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    return pydantic.create_model(f"{func.__name__}_arguments", __config__=config, **fields)


def _schema_of(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    _drop_titles(schema)
    schema.setdefault("properties", {})
    return schema


def _drop_titles(node: object) -> None:
    # pydantic titles every model and field; the model reads names and descriptions, titles only cost tokens.
    if isinstance(node, dict):
        if isinstance(node.get("title"), str):
            del node["title"]
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                for prop in value.values():
                    _drop_titles(prop)
            else:
                _drop_titles(value)
    elif isinstance(node, list):
        for item in node:
            _drop_titles(item)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The description and per-parameter descriptions of a docstring in any of the styles people write: Google
    (``Args:``), NumPy (``Parameters`` and dashes) or Sphinx (``:param x:``), read by docstring-parser."""
    import docstring_parser

    parsed = docstring_parser.parse(doc)
    text = "\n\n".join(part for part in (parsed.short_description, parsed.long_description) if part)
    params = {param.arg_name: " ".join((param.description or "").split()) for param in parsed.params}
    return text.strip(), params


def _explain(tool_name: str, exc: pydantic.ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"]) or "arguments"
        if error["type"] == "extra_forbidden":
            problems.append(f"{where}: not a parameter of {tool_name}")
        else:
            problems.append(f"{where}: {error['msg']}")
    return f"invalid arguments for {tool_name}: " + "; ".join(problems)


def _json_integers(value: object) -> object:
    """Integral floats as ints: JSON Schema counts 10.0 as an integer, and strict validation otherwise would not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _json_integers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_integers(v) for v in value]
    return value


def _short(value: object, limit: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"
