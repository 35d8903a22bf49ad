"""`--model scripted:NAME` or `--model scripted:FILE.json`: a model that replays written responses, so that `looptrace
run`, `resume`, the approval questions and `run --mcp` can be tried without an API key or a network.

NAME is one of the scripts shipped in ``looptrace.examples`` (``equipment`` for the tools of
``looptrace/examples/tools.py``, ``notes`` for the example MCP server's); FILE.json is a JSON array of responses in the
Messages API's shape, as ``ScriptedModel`` takes them. Each call is answered with the response for its place in the
conversation, so a run paused and resumed in another process goes on where it paused.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from looptrace.cli.common import UsageError

if TYPE_CHECKING:
    from looptrace.runtime import ScriptedModel

PREFIX = "scripted:"
SHIPPED = ("equipment", "notes")  # the JSON files of looptrace/examples/
MAX_SCRIPT_BYTES = 16 << 20


def is_scripted(model: str) -> bool:
    """Whether a model name asks for the offline model."""
    return model.startswith(PREFIX)


def scripted_model(model: str, *, stream: bool = False) -> ScriptedModel:
    """The offline model a ``scripted:`` name stands for; a script that cannot be read is a usage error."""
    from looptrace.runtime import ScriptedModel

    return ScriptedModel(_responses(model[len(PREFIX):]), follow_history=True, stream=stream)


def _responses(source: str) -> list[dict[str, Any]]:
    if source in SHIPPED:
        from looptrace import examples

        return json.loads(resources.files(examples).joinpath(f"{source}.json").read_text(encoding="utf-8"))
    if not source.endswith(".json"):
        raise UsageError(f"--model scripted:{source}: no such script; give one of {', '.join(SHIPPED)} or a "
                         "FILE.json of responses in the Messages API's shape")
    path = Path(source)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_SCRIPT_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"--model scripted:{source}: cannot read {path}: {exc.strerror or exc}") from None
    try:
        responses = json.loads(data) if len(data) <= MAX_SCRIPT_BYTES else None
    except ValueError as exc:
        raise UsageError(f"--model scripted:{source}: {path} is not JSON ({exc})") from None
    if not isinstance(responses, list) or not responses or not all(isinstance(r, dict) for r in responses):
        raise UsageError(f"--model scripted:{source}: {path} must hold a JSON array of responses (objects in the "
                         "Messages API's shape, e.g. {\"stop_reason\": \"end_turn\", \"content\": [{\"type\": "
                         "\"text\", \"text\": \"Done.\"}]})")
    return responses
