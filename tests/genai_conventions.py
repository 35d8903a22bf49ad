"""The GenAI semantic conventions' message and tool-definition structure, as models to validate spans with.

Written from the conventions' JSON schemas for gen_ai.input.messages, gen_ai.output.messages,
gen_ai.system_instructions and gen_ai.tool.definitions (model/gen-ai/*.json in open-telemetry/semantic-conventions-genai,
where the GenAI conventions moved from open-telemetry/semantic-conventions): each message has a role and a list of
parts; each part is discriminated by its ``type``; a function tool is ``{type: "function", name, description?,
parameters?}``. An output message's ``finish_reason`` is deprecated there ("report finish reasons in
gen_ai.response.finish_reasons instead") and no longer required, so these models refuse it: looptrace sends the finish
reasons on the span. The schemas allow extra properties and parts of other types (their GenericPart), so do these
models; a part whose type is one of the known ones must have that part's shape.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, TypeAdapter

KNOWN_PART_TYPES = {"text", "tool_call", "tool_call_response", "server_tool_call", "server_tool_call_response",
                    "blob", "file", "uri", "reasoning"}
FINISH_REASONS = {"stop", "length", "content_filter", "tool_call", "compaction", "error"}  # well known; others are allowed


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextPart(_Open):
    type: Literal["text"]
    content: str


class ToolCallRequestPart(_Open):
    type: Literal["tool_call"]
    id: str | None = None
    name: str
    arguments: Any = None


class ToolCallResponsePart(_Open):
    type: Literal["tool_call_response"]
    id: str | None = None
    response: Any


class ServerToolCallPart(_Open):
    type: Literal["server_tool_call"]
    id: str | None = None
    name: str
    server_tool_call: dict[str, Any]  # itself typed: {"type": ..., ...}


class ServerToolCallResponsePart(_Open):
    type: Literal["server_tool_call_response"]
    id: str | None = None
    server_tool_call_response: dict[str, Any]


class BlobPart(_Open):
    type: Literal["blob"]
    mime_type: str | None = None
    modality: str
    content: str  # base64 in JSON


class UriPart(_Open):
    type: Literal["uri"]
    mime_type: str | None = None
    modality: str
    uri: str


class FilePart(_Open):
    type: Literal["file"]
    mime_type: str | None = None
    modality: str
    file_id: str


class ReasoningPart(_Open):
    type: Literal["reasoning"]
    content: str


class GenericPart(_Open):
    type: str


_KNOWN = (TextPart | ToolCallRequestPart | ToolCallResponsePart | ServerToolCallPart | ServerToolCallResponsePart
          | BlobPart | UriPart | FilePart | ReasoningPart)
_KNOWN_PART = TypeAdapter(Annotated[_KNOWN, Field(discriminator="type")])
_GENERIC_PART = TypeAdapter(GenericPart)


def validate_part(part: Any) -> BaseModel:
    """A known part type must have its own shape; any other type is a generic part (a dict with a type)."""
    if isinstance(part, dict) and part.get("type") in KNOWN_PART_TYPES:
        return _KNOWN_PART.validate_python(part)
    return _GENERIC_PART.validate_python(part)


class ChatMessage(_Open):
    role: str  # system, user, assistant, tool, or another
    parts: list[dict[str, Any]]
    name: str | None = None

    def model_post_init(self, _context: Any) -> None:
        for part in self.parts:
            validate_part(part)


class OutputMessage(ChatMessage):
    def model_post_init(self, _context: Any) -> None:
        super().model_post_init(_context)
        # Deprecated by the output messages schema: the finish reasons belong in gen_ai.response.finish_reasons.
        assert "finish_reason" not in (self.model_extra or {}), "finish_reason inside an output message is deprecated"


class FunctionToolDefinition(_Open):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class GenericToolDefinition(_Open):
    type: str
    name: str


InputMessages = RootModel[list[ChatMessage]]
OutputMessages = RootModel[list[OutputMessage]]


def validate_system_instructions(parts: Any) -> None:
    assert isinstance(parts, list) and parts, "system instructions are a non-empty list of parts"
    for part in parts:
        validate_part(part)


def validate_tool_definitions(definitions: Any) -> None:
    assert isinstance(definitions, list)
    for definition in definitions:
        if isinstance(definition, dict) and definition.get("type") == "function":
            FunctionToolDefinition.model_validate(definition)
        else:
            GenericToolDefinition.model_validate(definition)
