"""The model seam: the real Anthropic client, and a scripted model that replays responses offline.

Both return the response as the Messages API's JSON (a dict). The loop keeps its history as plain JSON too, so what
it appends is exactly what the API sent, a RunResult can be dumped as is, and a scripted run looks like a real one.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol
from urllib.parse import urlsplit

from looptrace.instrumentation.interface import report_first_chunk


class Model(Protocol):
    """What the loop needs from a model. Implement it to put any Messages-API-compatible backend behind an Agent."""

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

    def __init__(self, client: Any = None, async_client: Any = None, *, stream: bool = False, **client_options: Any):
        self._client = _without_sdk_spans(client)
        self._async_client = _without_sdk_spans(async_client)
        self._options = client_options
        self.stream = stream

    def sync_client(self):
        if self._client is None:
            import anthropic

            self._client = _without_sdk_spans(anthropic.Anthropic(**self._options))
        return self._client

    def async_client(self):
        if self._async_client is None:
            import anthropic

            self._async_client = _without_sdk_spans(anthropic.AsyncAnthropic(**self._options))
        return self._async_client

    def server(self) -> tuple[str | None, int | None]:
        """Where the calls go, for the chat span; (None, None) until known. Asked before the first call, it never
        builds the client: importing the SDK and setting the client up is the call's work, on the run's clock."""
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
        # The clock starts before the client is built: the first call of a process imports the SDK and sets up its
        # HTTP client (most of a second), and that is the run's time too.
        deadline = time.monotonic() + timeout
        return _finish_by(deadline, timeout, lambda: self._create_until(self.sync_client(), params, deadline))

    def _create_until(self, client: Any, params: dict[str, Any], deadline: float) -> dict[str, Any]:
        for attempt in itertools.count():
            try:
                return self._send(client.with_options(max_retries=0), params, _time_left(deadline))
            except Exception as exc:
                delay = _retry_delay(exc, attempt, client.max_retries, deadline)
                if delay is None:
                    raise
                time.sleep(delay)
        raise AssertionError("unreachable: the attempts end by a return or a raise")

    async def acreate(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]:
        if timeout is None:
            return await self._asend(self.async_client(), params, {})
        deadline = time.monotonic() + timeout  # before the client is built: its set-up is the run's time too
        client = self.async_client()
        try:
            return await asyncio.wait_for(self._acreate_until(client, params, deadline),
                                          max(deadline - time.monotonic(), 0.001))
        except TimeoutError:
            raise ModelCallTimeout(_late_message(timeout)) from None

    async def _acreate_until(self, client: Any, params: dict[str, Any], deadline: float) -> dict[str, Any]:
        for attempt in itertools.count():
            try:
                return await self._asend(client.with_options(max_retries=0), params, _time_left(deadline))
            except Exception as exc:
                delay = _retry_delay(exc, attempt, client.max_retries, deadline)
                if delay is None:
                    raise
                await asyncio.sleep(delay)
        raise AssertionError("unreachable: the attempts end by a return or a raise")

    def _send(self, client: Any, params: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
        if self.stream:
            started = time.perf_counter()
            with client.messages.stream(**params, **options) as stream:
                first = True
                for _ in stream:  # read here rather than by get_final_message, to time the first event
                    if first:
                        report_first_chunk(time.perf_counter() - started)
                        first = False
                if first:
                    raise ServerDidNotStream.of(stream)
                return _as_json(stream.get_final_message())
        # The raw body is the API's JSON to the byte: no round trip through the SDK's models and back.
        raw = client.messages.with_raw_response.create(**params, **options)
        return raw.http_response.json()

    async def _asend(self, client: Any, params: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
        if self.stream:
            started = time.perf_counter()
            async with client.messages.stream(**params, **options) as stream:
                first = True
                async for _ in stream:
                    if first:
                        report_first_chunk(time.perf_counter() - started)
                        first = False
                if first:
                    raise ServerDidNotStream.of(stream)
                return _as_json(await stream.get_final_message())
        raw = await client.messages.with_raw_response.create(**params, **options)
        return raw.http_response.json()


class ServerDidNotStream(RuntimeError):
    """A streaming call whose answer held no server-sent event: a server (a proxy, a local stand-in) that answers a
    streaming request as if it were not one. The SDK would otherwise fail on an empty stream with a bare assertion."""

    @classmethod
    def of(cls, stream: Any) -> ServerDidNotStream:
        try:
            content_type = stream.response.headers.get("content-type") or "no content type"
        except Exception:  # noqa: BLE001 - the message is all this is for; a stream without headers still has one
            content_type = "an unknown content type"
        return cls(f"the server did not stream: it answered a streaming request (stream=true) with {content_type} "
                   "and no server-sent events; call it without streaming (stream=False; `looptrace run` without "
                   "--stream), or use a server that streams")


class ModelCallTimeout(TimeoutError):
    """A model call still unfinished when the run's wall-clock limit came."""


def _late_message(timeout: float) -> str:
    return f"the model call did not finish within the {timeout:.3g} s the run had left"


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
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


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


def _retry_after(headers: Any) -> float | None:
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        try:
            value = float(headers.get(name, "")) / scale
        except ValueError:
            continue
        if 0 < value <= 60:
            return value
    return None


def _without_sdk_spans(client: Any) -> Any:
    options = getattr(client, "open_telemetry", None)  # absent before the SDK traced itself: nothing to switch off
    if not isinstance(options, dict) or not options.get("traces", {}).get("enabled"):
        return client
    return client.with_options(open_telemetry={**options, "traces": {**options["traces"], "enabled": False}})


def _as_json(message: Any) -> dict[str, Any]:
    # exclude_unset keeps exactly the fields the server sent; warnings=False because block types newer than the SDK
    # are carried as loosely-typed objects that pydantic would otherwise complain about while dumping.
    return message.model_dump(mode="json", exclude_unset=True, warnings=False)


Response = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]] | BaseException


class ScriptedModel:
    """Replays responses in the Messages API shape, in order, for demos and for your own tests.

    Each item is a (possibly partial) response dict, a callable that receives the request parameters and returns one,
    or an exception to raise as the API client would. Missing fields are filled the way the API fills them. The
    parameters of every call are kept in ``requests``.
    """

    stream = False

    def __init__(self, responses: Iterable[Response] = ()) -> None:
        self._responses = list(responses)
        self._position = 0
        self._ids = itertools.count(1)
        self.requests: list[dict[str, Any]] = []

    def add(self, *responses: Response) -> None:
        self._responses.extend(responses)

    @property
    def remaining(self) -> int:
        return len(self._responses) - self._position

    def server(self) -> tuple[str | None, int | None]:
        return None, None

    def create(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]:
        self.requests.append(params)
        if self._position >= len(self._responses):
            raise ScriptExhausted(f"the scripted model has no response left for call {self._position + 1}")
        item = self._responses[self._position]
        self._position += 1
        if isinstance(item, BaseException):
            raise item
        if callable(item):
            item = item(params)
        return self._complete(item, params)

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
