"""The model seam: the real Anthropic client, and a scripted model that replays responses offline.

Both return the response as the Messages API's JSON (a dict). The loop keeps its history as plain JSON too, so what
it appends is exactly what the API sent, a RunResult can be dumped as is, and a scripted run looks like a real one.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import urlsplit

from looptrace.instrumentation.interface import report_first_chunk

if TYPE_CHECKING:
    import anthropic
    from anthropic.lib.streaming import AsyncMessageStream, MessageStream
    from anthropic.types import Message

_Client = TypeVar("_Client", "anthropic.Anthropic", "anthropic.AsyncAnthropic")


class Model(Protocol):
    """What the loop needs from a model. Implement it to put any Messages-API-compatible backend behind an Agent.

    Two optional methods are used when a model has them: ``prepare(asynchronous=False)``, called once a run has
    started and before its first turn, to do set-up work (build a client) on the run's time rather than inside the
    first model call's; and, while a streaming call runs, ``report_streamed_text(text)`` hands each piece of text
    to whoever watches the run (``TextStreamed`` events)."""

    stream: bool  # whether calls stream (recorded on the chat span as gen_ai.request.stream)

    def create(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]:
        """One Messages API call with ``params`` (model, max_tokens, system, tools, messages, ...), blocking.
        Returns the response as a dict; raises as the API client would. ``timeout`` is the seconds the run has
        left, or None for no limit."""
        ...

    async def acreate(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]:
        """The same call, for asyncio."""
        ...

    def server(self) -> tuple[str | None, int | None]:
        """The host and port calls go to, for the spans' server.address and server.port (None when unknown)."""
        ...


class AnthropicModel:
    """Calls the Messages API through the official SDK, with the SDK's own retries (429, 529, 5xx) left on.

    The clients are made on first use from the SDK's standard environment (ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL) and
    ``client_options``, or passed in ready-made. ``stream=True`` uses server-sent events, which the SDK requires for
    requests it expects to run longer than ten minutes.

    Recent SDKs trace their own API calls. looptrace's chat span already is that call, with the GenAI attributes and
    its place in the turn, so the SDK's span would be a second generation with the same usage (counted twice by
    backends such as Langfuse): its spans are switched off here, and trace-context propagation is left as it was.
    """

    def __init__(self, client: anthropic.Anthropic | None = None, async_client: anthropic.AsyncAnthropic | None = None,
                 *, stream: bool = False, **client_options: Any):
        self._client = None if client is None else _without_sdk_spans(client)
        self._async_client = None if async_client is None else _without_sdk_spans(async_client)
        self._options = client_options
        self.stream = stream

    def sync_client(self) -> anthropic.Anthropic:
        if self._client is None:
            import anthropic

            self._client = _without_sdk_spans(anthropic.Anthropic(**self._options))
        return self._client

    def async_client(self) -> anthropic.AsyncAnthropic:
        if self._async_client is None:
            import anthropic

            self._async_client = _without_sdk_spans(anthropic.AsyncAnthropic(**self._options))
        return self._async_client

    def prepare(self, *, asynchronous: bool = False) -> None:
        """Build the client the run's calls will use (importing the SDK, 1-2 s the first time in a process). The
        Agent calls this once a run has started, before its first turn: the set-up counts on the run (its clock,
        its root span), not on the first model call's duration."""
        if asynchronous:
            self.async_client()
        else:
            self.sync_client()

    def server(self) -> tuple[str | None, int | None]:
        """Where the calls go, for the chat span; (None, None) until known. Asked before the client is built (a
        model the run did not prepare), it does not build it: that stays the call's own work."""
        client = self._client or self._async_client
        base_url = client.base_url if client is not None else self._options.get("base_url")
        if not base_url:
            return None, None
        url = urlsplit(str(base_url))
        return url.hostname, url.port or (443 if url.scheme == "https" else 80)

    # Under a run's wall-clock limit the SDK's own retries would give every attempt the whole time left again (three
    # attempts, three times the limit). There looptrace retries itself, the errors the SDK retries, each attempt and
    # each pause fitted into what is left. And httpx applies a timeout to each read, not to the call: a body trickling
    # in a few bytes at a time never trips it. So the whole call, retries included, runs under the run's deadline: on
    # a thread the caller stops waiting for (sync), or under asyncio.wait_for, which cancels it (async).

    def create(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]:
        if timeout is None:
            return self._send(self.sync_client(), params, {})
        deadline = time.monotonic() + timeout  # before the client is built (when not prepared): the run's time too
        return _finish_by(deadline, timeout,
                          lambda: self._create_until(self.sync_client(), params, deadline, timeout))

    def _create_until(self, client: anthropic.Anthropic, params: dict[str, Any], deadline: float,
                      timeout: float) -> dict[str, Any]:
        for attempt in itertools.count():
            try:
                return self._send(client.with_options(max_retries=0), params, _time_left(deadline))
            except Exception as exc:
                delay = _retry_delay(exc, attempt, client.max_retries, deadline)
                if delay is None:
                    late = _as_late(exc, deadline, timeout)
                    if late is exc:
                        raise
                    raise late from exc
                time.sleep(delay)
        raise AssertionError("unreachable: the attempts end by a return or a raise")

    async def acreate(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]:
        if timeout is None:
            return await self._asend(self.async_client(), params, {})
        deadline = time.monotonic() + timeout  # before the client is built (when not prepared): the run's time too
        client = self.async_client()
        try:
            return await asyncio.wait_for(self._acreate_until(client, params, deadline, timeout),
                                          max(deadline - time.monotonic(), 0.001))
        except ModelCallTimeout:
            raise  # the call itself noticed the deadline first
        except TimeoutError:
            raise ModelCallTimeout(_late_message(timeout)) from None

    async def _acreate_until(self, client: anthropic.AsyncAnthropic, params: dict[str, Any], deadline: float,
                             timeout: float) -> dict[str, Any]:
        for attempt in itertools.count():
            try:
                return await self._asend(client.with_options(max_retries=0), params, _time_left(deadline))
            except Exception as exc:
                delay = _retry_delay(exc, attempt, client.max_retries, deadline)
                if delay is None:
                    late = _as_late(exc, deadline, timeout)
                    if late is exc:
                        raise
                    raise late from exc
                await asyncio.sleep(delay)
        raise AssertionError("unreachable: the attempts end by a return or a raise")

    def _send(self, client: anthropic.Anthropic, params: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
        if self.stream:
            started = time.perf_counter()
            with client.messages.stream(**params, **options) as stream:
                first = True
                for event in stream:  # read here rather than by get_final_message, to time the first event
                    if first:
                        report_first_chunk(time.perf_counter() - started)
                        first = False
                    _hand_on_text(event)
                if first:
                    raise ServerDidNotStream.of(stream)
                return _as_json(stream.get_final_message())
        # The raw body is the API's JSON to the byte: no round trip through the SDK's models and back.
        raw = client.messages.with_raw_response.create(**params, **options)
        return raw.http_response.json()

    async def _asend(self, client: anthropic.AsyncAnthropic, params: dict[str, Any],
                     options: dict[str, Any]) -> dict[str, Any]:
        if self.stream:
            started = time.perf_counter()
            async with client.messages.stream(**params, **options) as stream:
                first = True
                async for event in stream:
                    if first:
                        report_first_chunk(time.perf_counter() - started)
                        first = False
                    _hand_on_text(event)
                if first:
                    raise ServerDidNotStream.of(stream)
                return _as_json(await stream.get_final_message())
        raw = await client.messages.with_raw_response.create(**params, **options)
        return raw.http_response.json()


def prepare_model(model: object, *, timeout_s: float | None) -> None:
    """``model.prepare()`` when the model has one (an AnthropicModel builds its client), waiting at most ``timeout_s``,
    the time the run has left: a set-up slower than that leaves the run to time out, as a late model call would,
    instead of holding it past its limit. A set-up that fails is left to the first call, which meets the failure again
    and reports it where a failed call is reported."""
    prepare = getattr(model, "prepare", None)
    if not callable(prepare):
        return
    if timeout_s is None:
        _quietly(prepare, asynchronous=False)
        return
    worker = threading.Thread(target=_quietly, args=(prepare,), kwargs={"asynchronous": False},
                              name="looptrace-model-prepare", daemon=True)
    worker.start()
    worker.join(max(timeout_s, 0.0))


async def aprepare_model(model: object, *, timeout_s: float | None) -> None:
    """``prepare_model`` for asyncio: the set-up runs on a thread, so the event loop is not held by it either."""
    prepare = getattr(model, "prepare", None)
    if not callable(prepare):
        return
    work = asyncio.ensure_future(asyncio.to_thread(_quietly, prepare, asynchronous=True))
    try:
        await asyncio.wait_for(asyncio.shield(work), timeout=None if timeout_s is None else max(timeout_s, 0.0))
    except TimeoutError:
        pass  # the run's clock ran out first: the run says so


def _quietly(prepare: Callable[..., object], **options: bool) -> None:
    try:
        prepare(**options)
    except Exception:  # noqa: BLE001 - met again, and reported, by the first model call
        pass


class ServerDidNotStream(RuntimeError):
    """A streaming call whose answer held no server-sent event: a server (a proxy, a local stand-in) that answers a
    streaming request as if it were not one. The SDK would otherwise fail on an empty stream with a bare assertion."""

    @classmethod
    def of(cls, stream: MessageStream | AsyncMessageStream) -> ServerDidNotStream:
        try:
            content_type = stream.response.headers.get("content-type") or "no content type"
        except Exception:  # noqa: BLE001 - the message is all this is for; a stream without headers still has one
            content_type = "an unknown content type"
        return cls(f"the server did not stream: it answered a streaming request (stream=true) with {content_type} "
                   "and no server-sent events; call it without streaming (stream=False; `looptrace run` without "
                   "--stream), or use a server that streams")


class ModelCallTimeout(TimeoutError):
    """A model call still unfinished when the run's wall-clock limit came."""


# Where a streaming call hands the text it receives, piece by piece: set by the Agent around each model call (a
# context variable, so the call's own thread and task see it, and concurrent runs each see their own).
_streamed_text_receiver: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "looptrace_streamed_text", default=None)


@contextlib.contextmanager
def streamed_text_to(receiver: Callable[[str], None] | None) -> Iterator[None]:
    """While the block runs, a streaming model call hands each piece of text it receives to ``receiver``. Pieces that
    come after the block (a call left behind at the run's deadline, still reading) go nowhere."""
    if receiver is None:
        yield
        return
    open_ = [True]

    def while_open(text: str) -> None:
        if open_[0]:
            receiver(text)

    token = _streamed_text_receiver.set(while_open)
    try:
        yield
    finally:
        open_[0] = False
        _streamed_text_receiver.reset(token)


def report_streamed_text(text: str) -> None:
    """Hand a piece of streamed text to whoever watches the run (for a Model of your own that streams)."""
    receiver = _streamed_text_receiver.get()
    if receiver is not None and text:
        receiver(text)


def _hand_on_text(event: object) -> None:
    """The text of a server-sent ``content_block_delta`` event, handed on as it arrives."""
    if getattr(event, "type", None) == "content_block_delta":
        delta = getattr(event, "delta", None)
        if getattr(delta, "type", None) == "text_delta":
            report_streamed_text(getattr(delta, "text", "") or "")


def _late_message(timeout: float, last_attempt: BaseException | None = None) -> str:
    tail = "" if last_attempt is None else f" (its last attempt: {type(last_attempt).__name__}: {last_attempt})"
    return f"the model call did not finish within the {timeout:.3g} s the run had left{tail}"


def _as_late(exc: Exception, deadline: float, timeout: float) -> Exception:
    """The error a failed call ends with: ModelCallTimeout when the run's clock ran out, whichever layer noticed first
    (the SDK's own timeout, whose every attempt is given the time the run has left, or an attempt that failed at or
    after the deadline); else the call's own error."""
    import anthropic

    if isinstance(exc, ModelCallTimeout):
        return exc
    if isinstance(exc, anthropic.APITimeoutError) or time.monotonic() >= deadline:
        return ModelCallTimeout(_late_message(timeout, exc))
    return exc


def _finish_by(deadline: float, timeout: float, call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``call()``'s result, or ModelCallTimeout at the deadline. The call runs on a daemon thread that is left behind
    when late (its own read timeouts end it soon after): a blocking socket read cannot be interrupted from outside."""
    done = threading.Event()
    outcome: dict[str, Any] = {}
    context = contextvars.copy_context()  # the chat span stays current for whatever the SDK does

    def target() -> None:
        try:
            outcome["value"] = context.run(call)
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name="looptrace-model-call", daemon=True).start()
    if not done.wait(max(deadline - time.monotonic(), 0.0)):
        raise ModelCallTimeout(_late_message(timeout))
    error = outcome.get("error")
    if error is None:
        return outcome["value"]
    if isinstance(error, Exception) and not isinstance(error, ModelCallTimeout) and time.monotonic() >= deadline:
        raise ModelCallTimeout(_late_message(timeout, error)) from error  # the call noticed the deadline first
    raise error


def _time_left(deadline: float) -> dict[str, float]:
    return {"timeout": max(deadline - time.monotonic(), 0.001)}


def _retry_delay(exc: Exception, attempt: int, max_retries: int, deadline: float) -> float | None:
    """How long to wait before retrying a failed call, or None when it must not be retried (the SDK's rules: 408, 409,
    429 and 5xx, connection errors and timeouts, ``x-should-retry`` and ``retry-after``), or when no time is left."""
    import anthropic

    if attempt >= max_retries:
        return None
    if isinstance(exc, anthropic.APIStatusError):
        headers = exc.response.headers
        verdict = headers.get("x-should-retry")
        if verdict == "false" or (verdict != "true" and not (exc.status_code in (408, 409, 429)
                                                             or exc.status_code >= 500)):
            return None
        delay = _retry_after(headers)
    elif isinstance(exc, anthropic.APIConnectionError):  # includes timeouts
        delay = None
    else:
        return None
    if delay is None:
        delay = min(0.5 * 2**attempt, 8.0) * (1 - 0.25 * random.random())
    return delay if delay < deadline - time.monotonic() else None


def _retry_after(headers: Mapping[str, str]) -> float | None:
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        try:
            value = float(headers.get(name, "")) / scale
        except ValueError:
            continue
        if 0 < value <= 60:
            return value
    return None


def _without_sdk_spans(client: _Client) -> _Client:
    options = getattr(client, "open_telemetry", None)  # absent before the SDK traced itself: nothing to switch off
    if not isinstance(options, dict) or not options.get("traces", {}).get("enabled"):
        return client
    return client.with_options(open_telemetry={**options, "traces": {**options["traces"], "enabled": False}})


def _as_json(message: Message) -> dict[str, Any]:
    # exclude_unset keeps exactly the fields the server sent; warnings=False because block types newer than the SDK
    # are carried as loosely-typed objects that pydantic would otherwise complain about while dumping.
    return message.model_dump(mode="json", exclude_unset=True, warnings=False)


Response = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]] | BaseException


class ScriptedModel:
    """Replays responses in the Messages API shape, in order, for demos and for your own tests.

    Each item is a (possibly partial) response dict, a callable that receives the request parameters and returns one,
    or an exception to raise as the API client would. Missing fields are filled the way the API fills them. The
    parameters of every call are kept in ``requests``.

    ``follow_history=True`` answers each call with the response for its place in the conversation (the number of
    assistant messages in the request's history) rather than with the next one: a run paused and resumed from its
    state, in this process or another, goes on where it paused. ``stream=True`` hands each response's text to the
    run's watchers in pieces (``TextStreamed``), as a streaming call would.
    """

    def __init__(self, responses: Iterable[Response] = (), *, follow_history: bool = False,
                 stream: bool = False) -> None:
        self._responses = list(responses)
        self._position = 0
        self._ids = itertools.count(1)
        self.requests: list[dict[str, Any]] = []
        self.follow_history = follow_history
        self.stream = stream

    def add(self, *responses: Response) -> None:
        self._responses.extend(responses)

    @property
    def remaining(self) -> int:
        return len(self._responses) - self._position

    def server(self) -> tuple[str | None, int | None]:
        return None, None

    def create(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]:
        self.requests.append(params)
        position = self._position
        if self.follow_history:
            history = params.get("messages") or ()
            position = sum(1 for m in history if isinstance(m, dict) and m.get("role") == "assistant")
        if position >= len(self._responses):
            raise ScriptExhausted(f"the scripted model has no response left for call {position + 1}")
        item = self._responses[position]
        self._position = position + 1
        if isinstance(item, BaseException):
            raise item
        if callable(item):
            item = item(params)
        response = self._complete(item, params)
        if self.stream:
            for block in response["content"]:
                if isinstance(block, dict) and block.get("type") == "text":
                    for piece in re.findall(r"\S*\s*", str(block.get("text", ""))):
                        report_streamed_text(piece)
        return response

    async def acreate(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]:
        return self.create(params, timeout=timeout)

    def _complete(self, item: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        response = copy_tree(item)
        response.setdefault("id", f"msg_scripted_{next(self._ids):04d}")
        response.setdefault("type", "message")
        response.setdefault("role", "assistant")
        response.setdefault("model", params.get("model", "scripted"))
        response.setdefault("content", [])
        response.setdefault("stop_reason", "end_turn")
        response.setdefault("stop_sequence", None)
        usage = response.setdefault("usage", {})
        usage.setdefault("input_tokens", 0)
        usage.setdefault("output_tokens", 0)
        usage.setdefault("cache_creation_input_tokens", 0)
        usage.setdefault("cache_read_input_tokens", 0)
        return response


def copy_tree(item: dict[str, Any]) -> dict[str, Any]:
    """A copy of a response's dicts and lists, made without recursion: a tool input nested 900 levels deep (which the
    real client takes) must not end a test in RecursionError, as ``copy.deepcopy`` would. Other values (strings,
    numbers) are immutable or the caller's, and are shared as they are."""
    top: dict[str, Any] = {}
    pending: list[tuple[Any, Any]] = [(item, top)]
    while pending:
        source, target = pending.pop()
        pairs = source.items() if isinstance(source, dict) else enumerate(source)
        for key, value in pairs:
            if isinstance(value, (dict, list)):
                copied: Any = {} if isinstance(value, dict) else [None] * len(value)
                pending.append((value, copied))
                value = copied
            target[key] = value
    return top


class ScriptExhausted(RuntimeError):
    """The scripted model was called more often than it has responses."""
