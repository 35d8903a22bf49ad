"""The fake Messages API, exercised through the real anthropic SDK.

Everything the runtime's tests rely on is checked here from the client's side:
if the SDK parses it, retries it or rejects it here, it will do the same in
those tests. The validation rules are also checked directly, one by one.
"""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx2  # the SDK's HTTP library (a fork of httpx); its errors escape a broken stream unwrapped
import pytest
from anthropic.types import Message
from fakes.messages_api import (
    Delay,
    DropConnection,
    Error,
    FakeMessagesAPI,
    check_request,
    stream_events,
)

KEY = "test-key"
MODEL = "claude-test-1"
QUESTION = [{"role": "user", "content": "Which spans does the agent loop emit?"}]
SEARCH_TOOL = {
    "name": "search",
    "description": "Search the docs.",
    "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
}

TOOL_CALL = {
    "stop_reason": "tool_use",
    "content": [
        {"type": "text", "text": "Let me look that up in the documentation."},
        {"type": "tool_use", "id": "toolu_01", "name": "search", "input": {"q": "agent loop spans", "limit": 3}},
    ],
    "usage": {"input_tokens": 30000, "output_tokens": 10},
}
FINAL_ANSWER = {"stop_reason": "end_turn", "content": "One span per model call and per tool call."}


def client(api: FakeMessagesAPI, **options) -> anthropic.Anthropic:
    # A short timeout turns a hang into a failure instead of a stuck test run.
    options = {"api_key": KEY, "max_retries": 0, "timeout": 5.0, **options}
    return anthropic.Anthropic(base_url=api.url, **options)


def ask(sdk: anthropic.Anthropic, messages=QUESTION, **params) -> Message:
    return sdk.messages.create(model=MODEL, max_tokens=1024, messages=messages, **params)


def without_id(message: Message) -> dict:
    # Every answer gets a fresh msg_ id; the rest must match field for field.
    return message.model_dump(exclude={"id"})


# --------------------------------------------------------------------------
# Answers
# --------------------------------------------------------------------------


def test_tool_use_round_trip_then_end_turn():
    with FakeMessagesAPI([TOOL_CALL, FINAL_ANSWER]) as api, client(api) as sdk:
        first = ask(sdk, tools=[SEARCH_TOOL])
        assert first.stop_reason == "tool_use"
        call = first.content[1]
        assert (call.type, call.id, call.name) == ("tool_use", "toolu_01", "search")
        assert call.input == {"q": "agent loop spans", "limit": 3}

        history = [
            *QUESTION,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "3 hits"}]},
        ]
        second = ask(sdk, messages=history, tools=[SEARCH_TOOL])

    assert second.stop_reason == "end_turn"
    assert second.content[0].text == "One span per model call and per tool call."
    assert len(api.requests) == 2
    assert api.requests[1]["messages"][2]["content"][0]["tool_use_id"] == "toolu_01"
    assert api.headers[0]["anthropic-version"]  # header names are recorded lower-cased


def test_partial_answers_are_completed_like_the_api():
    with FakeMessagesAPI([TOOL_CALL, {"content": [{"type": "tool_use", "name": "search"}]}]) as api, client(api) as sdk:
        message = ask(sdk)
        bare_call = ask(sdk)

    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == MODEL  # echoed from the request
    assert message.stop_sequence is None
    usage = message.usage
    assert (usage.input_tokens, usage.output_tokens) == (30000, 10)  # as scripted
    assert (usage.cache_creation_input_tokens, usage.cache_read_input_tokens) == (0, 0)  # filled in
    assert message._request_id.startswith("req_")
    # A tool call without id, input or stop_reason gets all three.
    assert bare_call.stop_reason == "tool_use"
    assert bare_call.content[0].id.startswith("toolu_") and bare_call.content[0].input == {}


def test_callable_answers_from_the_request():
    def echo(body):
        return {"content": f"You said: {body['messages'][-1]['content']}"}

    with FakeMessagesAPI([echo]) as api, client(api) as sdk:
        assert ask(sdk).content[0].text == "You said: Which spans does the agent loop emit?"


def test_add_extends_the_script_and_remaining_counts_down():
    with FakeMessagesAPI() as api, client(api) as sdk:
        api.add(FINAL_ANSWER, FINAL_ANSWER)
        ask(sdk)
        assert api.remaining == 1


def test_an_exhausted_script_fails_at_once():
    with FakeMessagesAPI() as api, client(api, max_retries=2) as sdk:
        with pytest.raises(anthropic.InternalServerError, match="script exhausted"):
            ask(sdk)
    assert len(api.requests) == 1  # x-should-retry: false stops the SDK retrying


def test_unknown_stop_reason_and_block_type_reach_the_client():
    odd = {"stop_reason": "pondering", "content": [{"type": "hologram", "frames": 3}, {"type": "text", "text": "ok"}]}
    with FakeMessagesAPI([odd, odd, FINAL_ANSWER]) as api, client(api) as sdk:
        plain = ask(sdk)
        with sdk.messages.stream(model=MODEL, max_tokens=1024, messages=QUESTION) as stream:
            streamed = stream.get_final_message()
        ask(sdk)  # and the fake is still serving

    for message in (plain, streamed):
        assert message.stop_reason == "pondering"
        assert [block.type for block in message.content] == ["hologram", "text"]
        # The SDK keeps unknown blocks whole, but as its first union member,
        # so isinstance(block, TextBlock) is true for them: check .type instead.
        assert message.content[0].model_dump()["frames"] == 3


# --------------------------------------------------------------------------
# Streaming
# --------------------------------------------------------------------------

THOUGHTFUL_CALL = {
    **TOOL_CALL,
    "content": [
        {"type": "thinking", "thinking": "The user wants the span layout; search first.", "signature": "sig-abc"},
        *TOOL_CALL["content"],
    ],
}


def test_stream_helper_rebuilds_the_non_streaming_message():
    with FakeMessagesAPI([THOUGHTFUL_CALL, THOUGHTFUL_CALL]) as api, client(api) as sdk:
        plain = ask(sdk)
        with sdk.messages.stream(model=MODEL, max_tokens=1024, messages=QUESTION) as stream:
            streamed = stream.get_final_message()

    assert api.requests[1]["stream"] is True
    assert [block.type for block in plain.content] == ["thinking", "text", "tool_use"]
    assert without_id(streamed) == without_id(plain)


def fold(events) -> Message:
    """Rebuild a Message from raw stream events, independently of the SDK's helper."""
    message, blocks, tool_json = None, [], {}
    for event in events:
        if event.type == "message_start":
            message = event.message.model_dump()
        elif event.type == "content_block_start":
            blocks.append(event.content_block.model_dump())
        elif event.type == "content_block_delta":
            block, delta = blocks[event.index], event.delta
            if delta.type == "text_delta":
                block["text"] += delta.text
            elif delta.type == "thinking_delta":
                block["thinking"] += delta.thinking
            elif delta.type == "signature_delta":
                block["signature"] = delta.signature
            elif delta.type == "input_json_delta":
                tool_json[event.index] = tool_json.get(event.index, "") + delta.partial_json
        elif event.type == "message_delta":
            message["stop_reason"] = event.delta.stop_reason
            message["stop_sequence"] = event.delta.stop_sequence
            message["usage"]["output_tokens"] = event.usage.output_tokens
    for index, text in tool_json.items():
        if text:
            blocks[index]["input"] = json.loads(text)
    return Message.model_validate({**message, "content": blocks})


def test_raw_stream_has_the_api_event_sequence_and_rebuilds_the_message():
    with FakeMessagesAPI([THOUGHTFUL_CALL, THOUGHTFUL_CALL]) as api, client(api) as sdk:
        plain = ask(sdk)
        events = list(sdk.messages.create(model=MODEL, max_tokens=1024, messages=QUESTION, stream=True))

    kinds = [event.type for event in events]  # the SDK drops pings
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3
    assert kinds.count("content_block_delta") > 3  # several pieces per block

    start = events[0].message
    assert start.content == [] and start.stop_reason is None
    assert start.usage.input_tokens == 30000 and start.usage.output_tokens <= 1
    assert events[-2].usage.output_tokens == 10
    assert without_id(fold(events)) == without_id(plain)


def test_stream_events_match_the_wire_format():
    message = {
        "content": [{"type": "tool_use", "id": "toolu_9", "name": "search", "input": {}}],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 7},
    }
    events = list(stream_events(message))

    assert [event["type"] for event in events] == [
        "message_start", "content_block_start", "ping", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop",
    ]
    assert events[1]["content_block"] == {"type": "tool_use", "id": "toolu_9", "name": "search", "input": {}}
    # An empty tool input is a single empty fragment, as from the API.
    assert events[3]["delta"] == {"type": "input_json_delta", "partial_json": ""}
    assert events[5]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[5]["usage"]["output_tokens"] == 7


def test_dropped_stream_raises_instead_of_hanging():
    script = [DropConnection(after_events=4, item=FINAL_ANSWER)]
    with FakeMessagesAPI(script) as api, client(api, max_retries=2, timeout=60.0) as sdk:
        received = []
        with pytest.raises((anthropic.APIConnectionError, httpx2.TransportError)) as failed:
            for event in sdk.messages.create(model=MODEL, max_tokens=1024, messages=QUESTION, stream=True):
                received.append(event.type)
    # The cut itself ended the stream: a client left hanging would have failed by its read timeout instead.
    assert not isinstance(failed.value, (anthropic.APITimeoutError, httpx2.TimeoutException))
    # Four events sent (the ping among them, which the SDK drops), then the cut.
    assert received == ["message_start", "content_block_start", "content_block_delta"]
    assert len(api.requests) == 1  # a stream that already started is not retried


def test_dropped_stream_fails_the_stream_helper_too():
    with FakeMessagesAPI([DropConnection()]) as api, client(api) as sdk:
        with pytest.raises((anthropic.APIConnectionError, httpx2.TransportError)):
            with sdk.messages.stream(model=MODEL, max_tokens=1024, messages=QUESTION) as stream:
                stream.get_final_message()


def test_dropped_non_streaming_request_is_retried_as_a_connection_error():
    with FakeMessagesAPI([DropConnection(), FINAL_ANSWER]) as api, client(api, max_retries=1) as sdk:
        assert ask(sdk).stop_reason == "end_turn"
    assert len(api.requests) == 2


def test_delay_beyond_the_client_timeout_is_a_timeout():
    with FakeMessagesAPI([Delay(1.0, FINAL_ANSWER)]) as api, client(api, timeout=0.2) as sdk:
        with pytest.raises(anthropic.APITimeoutError):
            ask(sdk)


# --------------------------------------------------------------------------
# Errors and retries
# --------------------------------------------------------------------------


def test_rate_limit_is_retried_after_retry_after():
    rate_limited = Error(429, "rate_limit_error", "Number of request tokens has exceeded your limit", retry_after=0.01)
    script = [rate_limited, FINAL_ANSWER]
    slept: list[float] = []
    with FakeMessagesAPI(script) as api, client(api, max_retries=2) as sdk, \
            pytest.MonkeyPatch.context() as patch:
        patch.setattr(anthropic._base_client.time, "sleep", slept.append)  # the pause the SDK chose, not taken
        assert ask(sdk).stop_reason == "end_turn"

    assert len(api.requests) == 2
    assert [headers["x-stainless-retry-count"] for headers in api.headers] == ["0", "1"]
    assert slept == [pytest.approx(0.01)]  # retry-after was honoured; the SDK's own backoff starts near 0.4 s


def test_overloaded_529_is_retried():
    # No retry-after here, as is usual for 529s: this one waits out the SDK's own backoff.
    script = [Error(529, "overloaded_error", "Overloaded"), FINAL_ANSWER]
    with FakeMessagesAPI(script) as api, client(api, max_retries=2) as sdk:
        assert ask(sdk).stop_reason == "end_turn"
    assert len(api.requests) == 2


def test_internal_error_500_is_retried():
    script = [Error(500, "api_error", "Internal server error", retry_after=0.01), FINAL_ANSWER]
    with FakeMessagesAPI(script) as api, client(api, max_retries=2) as sdk:
        assert ask(sdk).stop_reason == "end_turn"
    assert len(api.requests) == 2


def test_retries_exhausted_surface_the_last_error():
    overloaded = Error(529, "overloaded_error", "Overloaded", retry_after=0.01)
    with FakeMessagesAPI([overloaded, overloaded]) as api, client(api, max_retries=1) as sdk:
        with pytest.raises(anthropic.OverloadedError) as raised:
            ask(sdk)
    assert raised.value.status_code == 529
    assert raised.value.body["type"] == "error"
    assert raised.value.body["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    assert raised.value.body["request_id"] == raised.value.request_id
    assert len(api.requests) == 2


def test_scripted_400_is_a_bad_request_error_with_its_message():
    error = Error(400, "invalid_request_error", "prompt is too long: 212000 tokens > 200000 maximum")
    with FakeMessagesAPI([error]) as api, client(api, max_retries=2) as sdk:
        with pytest.raises(anthropic.BadRequestError) as raised:
            ask(sdk)
    assert raised.value.body["error"]["message"] == "prompt is too long: 212000 tokens > 200000 maximum"
    assert raised.value.request_id.startswith("req_")
    assert len(api.requests) == 1  # 4xx is not retried


# --------------------------------------------------------------------------
# Validation, through the SDK
# --------------------------------------------------------------------------

MISSING_RESULT = (
    "messages.2: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_01. "
    "Each `tool_use` block must have a corresponding `tool_result` block in the next message."
)


def test_missing_tool_result_is_rejected_with_the_api_wording():
    history = [
        *QUESTION,
        {"role": "assistant", "content": TOOL_CALL["content"]},
        {"role": "user", "content": "Never mind, just answer."},
    ]
    with FakeMessagesAPI([FINAL_ANSWER]) as api, client(api) as sdk:
        with pytest.raises(anthropic.BadRequestError) as raised:
            ask(sdk, messages=history)
    assert raised.value.body["error"] == {"type": "invalid_request_error", "message": MISSING_RESULT}
    assert api.remaining == 1  # a rejected request does not use up the scripted answer


def test_wrong_api_key_is_an_authentication_error():
    with FakeMessagesAPI([FINAL_ANSWER], api_key="right-key") as api, client(api) as sdk:
        with pytest.raises(anthropic.AuthenticationError, match="invalid x-api-key"):
            ask(sdk)


def test_missing_anthropic_version_is_rejected():
    unversioned = {"default_headers": {"anthropic-version": anthropic.omit}}
    with FakeMessagesAPI([FINAL_ANSWER]) as api, client(api, **unversioned) as sdk:
        with pytest.raises(anthropic.BadRequestError, match="anthropic-version: header is required"):
            ask(sdk)


def test_validate_false_lets_anything_through():
    with FakeMessagesAPI([FINAL_ANSWER], api_key="other", validate=False) as api, client(api) as sdk:
        assert ask(sdk, messages=[{"role": "assistant", "content": "odd"}]).stop_reason == "end_turn"


# --------------------------------------------------------------------------
# Validation, rule by rule
# --------------------------------------------------------------------------

HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
VALID = {"model": MODEL, "max_tokens": 10, "messages": QUESTION}


def tool_use(tool_id):
    return {"type": "tool_use", "id": tool_id, "name": "search", "input": {}}


def tool_result(tool_id):
    return {"type": "tool_result", "tool_use_id": tool_id, "content": "ok"}


def blocks_result(tool_id, *blocks):
    return {"type": "tool_result", "tool_use_id": tool_id, "content": list(blocks)}


def image(media_type="image/png"):
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": "iVBORw0KGgo="}}


def conversation(assistant_blocks, user_blocks):
    return {**VALID, "messages": [*QUESTION, {"role": "assistant", "content": assistant_blocks},
                                  {"role": "user", "content": user_blocks}]}


def with_tool(**tool):
    return {**VALID, "tools": [SEARCH_TOOL, tool]}


REJECTED = {
    "missing model": ({"max_tokens": 10, "messages": QUESTION}, "model: Field required"),
    "missing max_tokens": ({"model": MODEL, "messages": QUESTION}, "max_tokens: Field required"),
    "empty messages": ({**VALID, "messages": []}, "messages: at least one message is required"),
    "assistant first": (
        {**VALID, "messages": [{"role": "assistant", "content": "Hi"}, *QUESTION]},
        'messages: first message must use the "user" role',
    ),
    "two user turns in a row": (
        {**VALID, "messages": [*QUESTION, *QUESTION]},
        'messages: roles must alternate between "user" and "assistant", but found multiple "user" roles in a row',
    ),
    "tool_result missing": (conversation([tool_use("toolu_01")], "Never mind"), MISSING_RESULT),
    "one of two tool_results missing": (
        conversation([tool_use("toolu_01"), tool_use("toolu_02")], [tool_result("toolu_02")]),
        "messages.2: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_01. "
        "Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
    ),
    "tool_result after text": (
        conversation([tool_use("toolu_01")], [{"type": "text", "text": "here:"}, tool_result("toolu_01")]),
        MISSING_RESULT,
    ),
    "tool_result for an unknown id": (
        conversation([tool_use("toolu_01")], [tool_result("toolu_01"), tool_result("toolu_99")]),
        "messages.2.content.1: unexpected `tool_use_id` found in `tool_result` blocks: toolu_99. "
        "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.",
    ),
    "tool_result with no tool_use before it": (
        {**VALID, "messages": [{"role": "user", "content": [tool_result("toolu_01")]}]},
        "messages.0.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_01. "
        "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.",
    ),
    "tool without name": (
        with_tool(input_schema={"type": "object"}),
        "tools.1.custom.name: Field required",
    ),
    "tool name with a space": (
        with_tool(name="web search", input_schema={"type": "object"}),
        "tools.1.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'",
    ),
    "tool name too long": (
        with_tool(name="x" * 129, input_schema={"type": "object"}),
        "tools.1.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'",
    ),
    "tool without input_schema": (with_tool(name="lookup"), "tools.1.custom.input_schema: Field required"),
    "tool schema not an object": (
        with_tool(name="lookup", input_schema={"type": "array"}),
        "tools.1.custom.input_schema.type: Input should be 'object'",
    ),
    "audio in a tool_result": (
        conversation([tool_use("toolu_01")], [blocks_result("toolu_01", {"type": "audio", "data": "AAAA"})]),
        "messages.2.content.0.content.0.type: Input tag 'audio' does not match any of the expected tags",
    ),
    "an image type the API cannot read": (
        conversation([tool_use("toolu_01")], [blocks_result("toolu_01", image("image/tiff"))]),
        "messages.2.content.0.content.0.source.media_type: Input should be image/jpeg, image/png, image/gif, "
        "image/webp",
    ),
}


@pytest.mark.parametrize("body, message", REJECTED.values(), ids=REJECTED.keys())
def test_rule_rejects(body, message):
    error = check_request(HEADERS, body, api_key=KEY)
    assert error is not None
    assert (error.status, error.error_type, error.message) == (400, "invalid_request_error", message)


ACCEPTED = {
    "plain question": VALID,
    "tool results in another order": conversation(
        [tool_use("toolu_01"), tool_use("toolu_02")], [tool_result("toolu_02"), tool_result("toolu_01")]
    ),
    "text after the tool results": conversation(
        [tool_use("toolu_01")], [tool_result("toolu_01"), {"type": "text", "text": "and also"}]
    ),
    "a 64-character tool name": with_tool(name="a" * 64, input_schema={"type": "object"}),
    "a server tool": {**VALID, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
    "text and an image as a tool's result": conversation(
        [tool_use("toolu_01")], [blocks_result("toolu_01", {"type": "text", "text": "a chart"}, image())]
    ),
}


@pytest.mark.parametrize("body", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_rule_accepts(body):
    assert check_request(HEADERS, body, api_key=KEY) is None


def test_the_key_is_accepted_in_either_header():
    # anthropic 2.x sends the API key as a Bearer token; older clients used x-api-key.
    version = {"anthropic-version": "2023-06-01"}
    assert check_request({"authorization": f"Bearer {KEY}", **version}, VALID, api_key=KEY) is None
    assert check_request({"x-api-key": KEY, **version}, VALID, api_key=KEY) is None
    assert check_request({"authorization": "Bearer nope", **version}, VALID, api_key=KEY).status == 401


# --------------------------------------------------------------------------
# Async
# --------------------------------------------------------------------------


def test_async_client_calls_streams_and_retries():
    async def conversation_with(api):
        async with anthropic.AsyncAnthropic(base_url=api.url, api_key=KEY, max_retries=1, timeout=5.0) as sdk:
            called = await sdk.messages.create(model=MODEL, max_tokens=1024, messages=QUESTION)
            async with sdk.messages.stream(model=MODEL, max_tokens=1024, messages=QUESTION) as stream:
                streamed = await stream.get_final_message()
            answered = await sdk.messages.create(model=MODEL, max_tokens=1024, messages=QUESTION)
            return called, streamed, answered

    script = [TOOL_CALL, TOOL_CALL, Error(429, "rate_limit_error", "slow down", retry_after=0.01), FINAL_ANSWER]
    with FakeMessagesAPI(script) as api:
        called, streamed, answered = asyncio.run(conversation_with(api))

    assert called.stop_reason == "tool_use"
    assert without_id(streamed) == without_id(called)
    assert answered.stop_reason == "end_turn"
    assert len(api.requests) == 4
    assert api.headers[0]["x-stainless-async"].startswith("async")
