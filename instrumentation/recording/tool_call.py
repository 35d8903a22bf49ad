"""One tool call as everything that reports on it sees it: made once, in the loop, and handed to the spans, the
detector, the events and the alerts alike.

The arguments are redacted as the call starts (a value under a secret-looking key, or one an argument marks secret,
never leaves the process), canonicalised for the detector's comparisons, and the result is scrubbed of what the
redaction hid and digested once, as the call settles. Nothing that reports on a call reads it back from a span: the
span is written from this view, as the detector is fed from it. The model itself gets the unredacted result (it sent
the secret); only what reports on the call gets this one.
"""

from __future__ import annotations

from ..detector import canonical_arguments, result_digest
from .content import redact_with_secrets, scrub

__all__ = ["ToolCallView"]


class ToolCallView:
    """A tool call's reportable facts: its name and redacted arguments from the start, its result once settled."""

    __slots__ = ("_arguments_digest", "arguments", "call_id", "canonical", "duration_s", "error_type", "failed",
                 "is_error", "name", "outcome", "result", "result_chars", "result_digest", "secrets")

    def __init__(self, call_id: str, name: str, arguments: object) -> None:
        self.call_id = call_id
        self.name = name
        # Redacted, with the texts the redaction hid in the forms a tool's text may quote them back.
        self.arguments, self.secrets = redact_with_secrets(arguments)
        self.canonical = canonical_arguments(self.arguments)  # what the detector compares calls by
        self._arguments_digest: str | None = None
        # Set by settle():
        self.result: str | None = None  # what the model is sent, scrubbed of what the redaction hid
        self.result_digest: str | None = None
        self.result_chars = 0  # of the result before it was cut for the model
        self.is_error = False  # an is_error tool_result (a rejection included)
        self.failed = False  # a failure the model could leave unresolved (a person's rejection is a decision)
        self.outcome = "ok"  # ok | error | timeout | invalid_arguments | unknown_tool | rejected | interrupted | ...
        self.error_type: str | None = None
        self.duration_s = 0.0

    @property
    def arguments_digest(self) -> str:
        """A digest of the canonical arguments: what a span records in their place when content is not captured."""
        if self._arguments_digest is None:
            self._arguments_digest = result_digest(self.canonical)
        return self._arguments_digest

    @property
    def settled(self) -> bool:
        return self.result is not None

    def scrub(self, text: str) -> str:
        """``text`` with the values the redaction hid replaced wherever it quotes them."""
        return scrub(text, self.secrets) if self.secrets else text

    def settle(self, result: str, *, is_error: bool, outcome: str, failed: bool | None = None,
               error_type: str | None = None, duration_s: float = 0.0, full_length: int | None = None) -> None:
        """The call came back with ``result`` (the text the model is sent, cut to its limit; ``full_length`` before
        the cut): scrubbed and digested here, once."""
        self.result = self.scrub(result)
        self.result_digest = result_digest(self.result)
        self.result_chars = len(result) if full_length is None else full_length
        self.is_error = is_error
        self.failed = is_error if failed is None else failed
        self.outcome = outcome
        self.error_type = error_type
        self.duration_s = duration_s
