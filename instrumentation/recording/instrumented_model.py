"""A model with its calls traced: the chat span of every Messages API call, opened around the model, not by the loop.

``Tracing.instrument(model)`` returns an ``InstrumentedModel``; the loop calls its ``answer`` (the response with its
usage and cost, worked out once for the span and the loop's budget alike), anything else ``create`` as it would the
model. Each call looks up the turn that is current (``TurnSpan.activate``), opens its chat span there, keeps it
current while the model runs (so the HTTP client's own spans nest under it, and a streaming model's first chunk is
timed on it through ``interface.report_first_chunk``), and ends it with the response, its usage and its cost, or with
the exception. A call made outside any run (the model used on its own) is passed through untraced, priced.

The judge's calls (``judge=True``) get a span of their own kind, marked ``looptrace.judge``: their tokens and cost are
never the run's, so they are not counted as one of its generations.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol

from ..logs import telemetry_failed
from .usage import CostOf, Usage

__all__ = ["Answer", "ChatCall", "CurrentTurn", "InstrumentedModel", "ModelLike", "PricedModel", "current_turn_var",
           "first_chunk_receiver", "report_first_chunk"]


class ModelLike(Protocol):
    """The model seam as telemetry sees it (``runtime.models.Model`` is the loop's own, identical, description)."""

    stream: bool

    def create(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]: ...

    async def acreate(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]: ...

    def server(self) -> tuple[str | None, int | None]: ...


# A streaming model reports its first chunk through this: the instrumented wrapper sets a receiver while the call
# runs, so a model implementation needs no telemetry of its own (and one called outside a run costs a lookup).
first_chunk_receiver: contextvars.ContextVar[Callable[[float], None] | None] = contextvars.ContextVar(
    "looptrace_first_chunk", default=None)


def report_first_chunk(seconds: float) -> None:
    """A streaming model call got its first chunk ``seconds`` after it was sent (the chat span's time to first
    chunk). Free when nothing listens."""
    receiver = first_chunk_receiver.get()
    if receiver is not None:
        receiver(seconds)


class Answer(NamedTuple):
    """A model call's response, with its usage (parsed once) and its cost by the agent's price table (None: the model
    has no price there)."""

    response: dict[str, Any]
    usage: Usage
    cost_usd: float | None


class ChatCall(Protocol):
    """The span of one model call (``spans.ChatSpan``, ``spans.JudgeSpan``), as the wrapper drives it."""

    def activate(self) -> AbstractContextManager[object]: ...

    def first_chunk(self, seconds: float) -> None: ...

    def learned_server(self, address: str | None, port: int | None) -> None:
        """Where the call went, known only once the call was made (a client built by the call itself)."""
        ...

    def end(self, response: Mapping[str, Any], usage: Usage, *, cost_usd: float | None) -> None: ...

    def fail(self, exc: BaseException) -> None: ...


class CurrentTurn(Protocol):
    """The turn a model call belongs to (``spans.TurnSpan``): it opens the call's span."""

    def start_chat(self, params: Mapping[str, Any], *, server_address: str | None, server_port: int | None,
                   stream: bool, judge: bool = False) -> ChatCall: ...


# The turn whose model call runs in this context: set by TurnSpan.activate() around the call, read by the wrapper.
current_turn_var: contextvars.ContextVar[CurrentTurn | None] = contextvars.ContextVar("looptrace_turn", default=None)


class InstrumentedModel:
    """Wraps a model (``runtime.models.Model``): same calls, same results, with a chat span per call."""

    __slots__ = ("_server", "cost_of", "judge", "model", "stream")

    def __init__(self, model: ModelLike, *, cost_of: CostOf | None = None, judge: bool = False) -> None:
        self.model = model
        self.stream = bool(getattr(model, "stream", False))
        self.cost_of = cost_of
        self.judge = judge
        self._server: tuple[str | None, int | None] | None = None

    def server(self) -> tuple[str | None, int | None]:
        """Where calls go (server.address/port), looked up until known, then kept; a model that cannot say is never
        allowed to fail. (A model may know only once its first call has built its client: it is not asked to build
        one here, before the chat span, where the set-up would be a gap nobody could explain.)"""
        if self._server is None:
            try:
                address, port = self.model.server()
                found = (address, port)
            except Exception:  # a custom model that cannot say (or says it in another shape): no server named
                found = (None, None)
            if found[0] is not None:
                self._server = found
            return found
        return self._server

    def create(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]:
        return self.answer(params, timeout=timeout).response

    async def acreate(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]:
        return (await self.aanswer(params, timeout=timeout)).response

    def answer(self, params: dict[str, Any], *, timeout: float | None) -> Answer:
        """The call, traced, with its usage and cost."""
        chat = self._start(params)
        if chat is None:
            return _priced(self.model.create(params, timeout=timeout), self.cost_of)
        with chat.activate():
            receiver = first_chunk_receiver.set(chat.first_chunk)
            try:
                response = self.model.create(params, timeout=timeout)
            except BaseException as exc:
                self._learn_server(chat)
                chat.fail(exc)
                raise
            finally:
                first_chunk_receiver.reset(receiver)
        return self._end(chat, response)

    # answer() and aanswer() are the same lines but for `await`: one function cannot both block and await.

    async def aanswer(self, params: dict[str, Any], *, timeout: float | None) -> Answer:
        """``answer`` in asyncio."""
        chat = self._start(params)
        if chat is None:
            return _priced(await self.model.acreate(params, timeout=timeout), self.cost_of)
        with chat.activate():
            receiver = first_chunk_receiver.set(chat.first_chunk)
            try:
                response = await self.model.acreate(params, timeout=timeout)
            except BaseException as exc:
                self._learn_server(chat)
                chat.fail(exc)
                raise
            finally:
                first_chunk_receiver.reset(receiver)
        return self._end(chat, response)

    def _learn_server(self, chat: ChatCall) -> None:
        """Where the call went, for a span started before the model knew (its first call built its client)."""
        try:
            chat.learned_server(*self.server())
        except Exception as exc:  # never into the run
            telemetry_failed("chat span", exc)

    def _start(self, params: dict[str, Any]) -> ChatCall | None:
        turn = current_turn_var.get()
        if turn is None:
            return None
        address, port = self.server()
        try:
            return turn.start_chat(params, server_address=address, server_port=port, stream=self.stream,
                                   judge=self.judge)
        except Exception as exc:  # the call goes ahead untraced rather than not at all
            telemetry_failed("chat span", exc)
            return None

    def _end(self, chat: ChatCall, response: dict[str, Any]) -> Answer:
        self._learn_server(chat)
        answer = _priced(response, self.cost_of)
        chat.end(response, answer.usage, cost_usd=answer.cost_usd)  # never raises (see spans._never_raises)
        return answer

    def __getattr__(self, name: str) -> Any:
        # What else the model offers (ScriptedModel.remaining, AnthropicModel.sync_client) stays reachable.
        if name == "model":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.model, name)


class PricedModel:
    """A model whose calls are priced but not traced: ``answer`` as ``InstrumentedModel`` gives it, without spans (what
    telemetry switched off instruments a model with)."""

    __slots__ = ("cost_of", "model", "stream")

    def __init__(self, model: ModelLike, *, cost_of: CostOf | None = None) -> None:
        self.model = model
        self.stream = bool(getattr(model, "stream", False))
        self.cost_of = cost_of

    def create(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]:
        return self.model.create(params, timeout=timeout)

    async def acreate(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]:
        return await self.model.acreate(params, timeout=timeout)

    def answer(self, params: dict[str, Any], *, timeout: float | None) -> Answer:
        return _priced(self.model.create(params, timeout=timeout), self.cost_of)

    async def aanswer(self, params: dict[str, Any], *, timeout: float | None) -> Answer:
        return _priced(await self.model.acreate(params, timeout=timeout), self.cost_of)

    def server(self) -> tuple[str | None, int | None]:
        return self.model.server()

    def __getattr__(self, name: str) -> Any:
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)


def _priced(response: dict[str, Any], cost_of: CostOf | None) -> Answer:
    """``response`` with its usage, parsed once, and its cost (None without a price; a price table that cannot price
    this response leaves the cost unknown, never the run ended)."""
    usage = Usage.from_response(response)
    cost = None
    if cost_of is not None:
        try:
            cost = cost_of(response, usage)
        except Exception:
            cost = None
    return Answer(response, usage, cost)
