"""Every span a run produces, with its GenAI attributes, its place in the tree and what content it may carry."""

from __future__ import annotations

import json

import pytest
from genai_conventions import InputMessages, OutputMessages, validate_system_instructions, validate_tool_definitions
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from looptrace.cli.demo import DEMO_TASK, Inventory, equipment_script
from looptrace.instrumentation.recording import semconv as sc
from looptrace.runtime import Agent, Limits, RunStatus, ScriptedModel, tool

MODEL = "claude-sonnet-4-5"


def run_story(spans, **agent_options):
    agent = Agent(MODEL, tools=Inventory().tools(), client=ScriptedModel(equipment_script()), name="booking",
                  system="Book things.", tracer_provider=spans.provider, **agent_options)
    return agent.run(DEMO_TASK)


def test_one_trace_per_run_with_the_documented_tree(spans):
    result = run_story(spans)

    assert len(spans.named("invoke_agent")) == 1
    assert len(spans.named("turn")) == 4
    assert len(spans.named("chat ")) == 4
    assert len(spans.named("execute_tool ")) == 3
    assert {format(s.context.trace_id, "032x") for s in spans.all} == {result.trace_id}

    root = spans.one("invoke_agent")
    assert root.name == "invoke_agent booking" and root.kind is SpanKind.INTERNAL and root.parent is None
    turns = sorted(spans.children_of(root), key=lambda s: s.attributes[sc.TURN_INDEX])
    # One name for every turn (span metrics make one series of it); the index is an attribute.
    assert [t.name for t in turns] == ["turn"] * 4
    assert [t.attributes[sc.TURN_INDEX] for t in turns] == [1, 2, 3, 4]
    children = [sorted(c.name for c in spans.children_of(t)) for t in turns]
    assert children == [
        ["chat claude-sonnet-4-5", "execute_tool search_equipment"],
        ["chat claude-sonnet-4-5", "execute_tool reserve_equipment"],
        ["chat claude-sonnet-4-5", "execute_tool reserve_equipment"],
        ["chat claude-sonnet-4-5"],
    ]


def test_root_span_attributes(spans):
    result = run_story(spans)
    a = spans.one("invoke_agent").attributes
    assert a[sc.GEN_AI_OPERATION_NAME] == "invoke_agent"
    assert a[sc.GEN_AI_PROVIDER_NAME] == "anthropic"
    assert a[sc.GEN_AI_AGENT_NAME] == "booking"
    assert a[sc.GEN_AI_REQUEST_MODEL] == MODEL
    assert a[sc.RUN_STATUS] == "done"
    assert a[sc.RUN_TURNS] == 4
    assert a[sc.RUN_USAGE_TOTAL_TOKENS] == result.usage.total_tokens == 2445
    assert a[sc.RUN_COST_USD] == pytest.approx(result.cost_usd)
    assert a[sc.RUN_ANOMALY_COUNT] == 0
    # Run totals must not look like usage of the root span itself, or backends would count tokens twice.
    assert not any(key.startswith("gen_ai.usage.") for key in a)


def test_turn_spans_carry_the_raw_stop_reason(spans):
    run_story(spans)
    turns = sorted(spans.named("turn"), key=lambda s: s.attributes[sc.TURN_INDEX])
    assert [t.attributes[sc.STOP_REASON] for t in turns] == ["tool_use"] * 3 + ["end_turn"]
    assert all(t.attributes[sc.GEN_AI_AGENT_NAME] == "booking" for t in turns)  # no span without a gen_ai.* key


def test_chat_span_attributes(spans):
    run_story(spans)
    chats = sorted(spans.named("chat "), key=lambda s: s.start_time)
    first, last = chats[0], chats[-1]
    assert first.kind is SpanKind.CLIENT
    a = first.attributes
    assert a[sc.GEN_AI_OPERATION_NAME] == "chat"
    assert a[sc.GEN_AI_PROVIDER_NAME] == "anthropic"
    assert a[sc.GEN_AI_REQUEST_MODEL] == MODEL
    assert a[sc.GEN_AI_REQUEST_MAX_TOKENS] == 4096
    assert a[sc.GEN_AI_RESPONSE_MODEL] == MODEL
    assert a[sc.GEN_AI_RESPONSE_ID].startswith("msg_")
    assert a[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("tool_call",)
    assert last.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert a[sc.GEN_AI_USAGE_INPUT_TOKENS] == 412
    assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 38
    assert a[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 0


def test_input_tokens_on_chat_spans_include_the_cache(spans):
    response = {"stop_reason": "end_turn", "content": [{"type": "text", "text": "hi"}],
                "usage": {"input_tokens": 100, "output_tokens": 7, "cache_read_input_tokens": 2000,
                          "cache_creation_input_tokens": 300}}
    Agent(MODEL, client=ScriptedModel([response]), tracer_provider=spans.provider).run("hi")
    a = spans.one("chat ").attributes
    assert a[sc.GEN_AI_USAGE_INPUT_TOKENS] == 2400
    assert a[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 2000
    assert a[sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS] == 300
    assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 7


@pytest.mark.parametrize("stop_reason, finish", [("max_tokens", "length"), ("stop_sequence", "stop"),
                                                 ("refusal", "content_filter"), ("pause_turn", "pause_turn")])
def test_finish_reasons_are_normalised_like_the_otel_anthropic_instrumentation(spans, stop_reason, finish):
    script = [{"stop_reason": stop_reason, "content": []}, {"stop_reason": "end_turn", "content": []}]
    Agent(MODEL, client=ScriptedModel(script), tracer_provider=spans.provider).run("x")
    first = min(spans.named("chat "), key=lambda s: s.start_time)
    assert first.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == (finish,)
    assert first.attributes[sc.STOP_REASON] == stop_reason


def test_tool_span_attributes_and_the_failed_call(spans):
    run_story(spans)
    tools = sorted(spans.named("execute_tool "), key=lambda s: s.start_time)
    search, failed, reserved = tools
    a = search.attributes
    assert a[sc.GEN_AI_OPERATION_NAME] == "execute_tool"
    assert a[sc.GEN_AI_TOOL_NAME] == "search_equipment"
    assert a[sc.GEN_AI_TOOL_CALL_ID] == "toolu_01"
    assert a[sc.GEN_AI_TOOL_TYPE] == "function"
    assert a[sc.GEN_AI_TOOL_DESCRIPTION].startswith("Search office equipment")
    assert json.loads(a[sc.GEN_AI_TOOL_CALL_ARGUMENTS]) == {"keyword": "projector"}
    assert json.loads(a[sc.GEN_AI_TOOL_CALL_RESULT])[0]["item_id"] == "EQ-001"
    assert len(a[sc.TOOL_RESULT_DIGEST]) == 16
    assert search.status.status_code is StatusCode.UNSET

    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes[sc.ERROR_TYPE] == "RuntimeError"
    assert failed.attributes[sc.TOOL_IS_ERROR] is True
    assert "EQ-001 has no stock" in failed.attributes[sc.GEN_AI_TOOL_CALL_RESULT]
    assert reserved.status.status_code is StatusCode.UNSET


def test_conversation_content_is_captured_in_the_genai_message_shape(spans):
    run_story(spans)
    root = spans.one("invoke_agent").attributes
    assert json.loads(root[sc.GEN_AI_SYSTEM_INSTRUCTIONS]) == [{"type": "text", "content": "Book things."}]
    definitions = json.loads(root[sc.GEN_AI_TOOL_DEFINITIONS])
    assert [(t["type"], t["name"]) for t in definitions] == [("function", "search_equipment"),
                                                             ("function", "reserve_equipment")]
    assert definitions[0]["parameters"]["properties"]["keyword"]["type"] == "string"
    assert "input_schema" not in definitions[0]
    second_chat = sorted(spans.named("chat "), key=lambda s: s.start_time)[1].attributes
    history = json.loads(second_chat[sc.GEN_AI_INPUT_MESSAGES])
    assert [m["role"] for m in history] == ["user", "assistant", "user"]
    assert history[1]["parts"][0] == {"type": "tool_call", "id": "toolu_01", "name": "search_equipment",
                                      "arguments": {"keyword": "projector"}}
    assert history[2]["parts"][0]["type"] == "tool_call_response"
    output = json.loads(second_chat[sc.GEN_AI_OUTPUT_MESSAGES])
    assert output[0]["role"] == "assistant" and "finish_reason" not in output[0]  # deprecated there
    assert second_chat[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("tool_call",)


def test_no_content_switch_keeps_content_off_every_span_but_keeps_the_digest(spans, monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "NO_CONTENT")
    run_story(spans)
    content_keys = {sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES, sc.GEN_AI_SYSTEM_INSTRUCTIONS,
                    sc.GEN_AI_TOOL_CALL_ARGUMENTS, sc.GEN_AI_TOOL_CALL_RESULT, sc.GEN_AI_TOOL_DEFINITIONS}
    for span in spans.all:
        assert not content_keys & set(span.attributes), span.name
    assert all(sc.TOOL_RESULT_DIGEST in s.attributes for s in spans.named("execute_tool"))


def test_the_looptrace_switch_turns_content_off_too(spans):
    run_story(spans, capture_content=False)
    assert not any(sc.GEN_AI_TOOL_CALL_ARGUMENTS in s.attributes for s in spans.all)


def test_secret_looking_arguments_are_redacted_and_token_counts_are_not(spans):
    @tool
    def login(user: str, password: str, api_key: str, max_tokens: int) -> str:
        """Log in."""
        return "ok"

    script = [{"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "t1", "name": "login", "input": {
        "user": "ana", "password": "hunter2", "api_key": "sk-123", "max_tokens": 5}}]},
              {"stop_reason": "end_turn", "content": []}]
    Agent(MODEL, tools=[login], client=ScriptedModel(script), tracer_provider=spans.provider).run("x")
    arguments = json.loads(spans.one("execute_tool").attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS])
    assert arguments == {"user": "ana", "password": "[REDACTED]", "api_key": "[REDACTED]", "max_tokens": 5}
    everything = json.dumps([dict(s.attributes) for s in spans.all], default=str)
    assert "hunter2" not in everything and "sk-123" not in everything


def test_large_values_are_capped_with_a_visible_marker(spans, monkeypatch):
    monkeypatch.setenv("LOOPTRACE_MAX_ATTRIBUTE_CHARS", "500")

    @tool
    def dump() -> str:
        """Return a lot."""
        return "y" * 5000

    script = [{"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "t1", "name": "dump", "input": {}}]},
              {"stop_reason": "end_turn", "content": []}]
    Agent(MODEL, tools=[dump], client=ScriptedModel(script), tracer_provider=spans.provider).run("x")
    a = spans.one("execute_tool").attributes
    assert a[sc.GEN_AI_TOOL_CALL_RESULT].endswith("…[truncated 4500 of 5000 chars]")
    assert a[sc.TOOL_RESULT_CHARS] == 5000


def test_a_failed_model_call_is_an_error_span_and_an_error_run(spans):
    model = ScriptedModel([TimeoutError("upstream took too long")])
    result = Agent(MODEL, client=model, tracer_provider=spans.provider).run("x")
    assert result.status is RunStatus.ERROR
    chat = spans.one("chat ")
    assert chat.status.status_code is StatusCode.ERROR
    assert chat.attributes[sc.ERROR_TYPE] == "TimeoutError"
    root = spans.one("invoke_agent")
    assert root.status.status_code is StatusCode.ERROR
    assert root.attributes[sc.RUN_STATUS] == "error"
    assert "upstream took too long" in root.attributes[sc.RUN_ERROR]


def test_a_limit_is_a_status_on_the_root_not_an_error(spans):
    script = [{"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": {}}]}] * 3
    Agent(MODEL, client=ScriptedModel(script), limits=Limits(max_turns=2), tracer_provider=spans.provider).run("x")
    root = spans.one("invoke_agent")
    assert root.attributes[sc.RUN_STATUS] == "max_turns"
    assert root.status.status_code is StatusCode.UNSET


def test_a_run_inside_an_existing_span_joins_its_trace(spans):
    outer_tracer = spans.provider.get_tracer("the-app")
    with outer_tracer.start_as_current_span("handle request") as outer:
        result = Agent(MODEL, client=ScriptedModel([{"content": []}]), tracer_provider=spans.provider).run("x")
    root = spans.one("invoke_agent")
    assert root.parent.span_id == outer.get_span_context().span_id
    assert result.trace_id == format(outer.get_span_context().trace_id, "032x")


def test_a_tools_own_spans_nest_under_its_execute_tool_span(spans):
    tracer = spans.provider.get_tracer("tool-internals")

    @tool
    def traced() -> str:
        """Makes a span of its own."""
        with tracer.start_as_current_span("inner work"):
            return "ok"

    script = [{"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "t", "name": "traced", "input": {}}]},
              {"content": []}]
    Agent(MODEL, tools=[traced], client=ScriptedModel(script), tracer_provider=spans.provider).run("x")
    assert spans.one("inner work").parent.span_id == spans.one("execute_tool").context.span_id


def test_without_an_sdk_nothing_is_recorded_and_nothing_breaks():
    # The global provider of a fresh process is the API's no-op: the run works, the trace id is all zeros.
    provider = trace.NoOpTracerProvider()
    result = Agent(MODEL, client=ScriptedModel(equipment_script()), tools=Inventory().tools(),
                   tracer_provider=provider).run(DEMO_TASK)
    assert result.status is RunStatus.DONE
    assert result.trace_id == "0" * 32


def test_a_long_history_keeps_its_newest_messages_as_valid_json(spans, monkeypatch):
    monkeypatch.setenv("LOOPTRACE_MAX_ATTRIBUTE_CHARS", "3000")

    @tool
    def page(n: int) -> str:
        """A page of a long document."""
        return f"page {n} " + "x" * 1000

    script = [{"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": f"t{n}", "name": "page",
                                                       "input": {"n": n}}]} for n in range(6)]
    Agent(MODEL, tools=[page], client=ScriptedModel(script + [{"content": []}]), detector=False,
          tracer_provider=spans.provider).run("read it all")
    last_chat = max(spans.named("chat "), key=lambda s: s.start_time).attributes
    history = json.loads(last_chat[sc.GEN_AI_INPUT_MESSAGES])  # valid JSON, not a cut string
    assert history[-1]["parts"][0]["response"].startswith("page 5 ")  # what the model was answering is there
    assert len(last_chat[sc.GEN_AI_INPUT_MESSAGES]) <= 3000
    assert last_chat[sc.INPUT_MESSAGES_OMITTED] == 13 - len(history)


# --- the conventions' structure, for a whole run ----------------------------------------------------------------

def continued_history():
    """A conversation to continue: the first request, a tool call, its result (an error), and a reply."""
    return [
        {"role": "user", "content": [{"type": "text", "text": "Reserve a projector"},
                                     {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": "iVBORw0KGgo="}}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "search first", "signature": "s"},
                                          {"type": "tool_use", "id": "toolu_00", "name": "search_equipment",
                                           "input": {"keyword": "beamer"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_00", "is_error": True,
                                      "content": "no such item"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Nothing called beamer. Try projector?"}]},
        {"role": "user", "content": "Yes, a projector for 2026-10-08."},
    ]


def content_of(span, key):
    value = span.attributes.get(key)
    assert isinstance(value, str), f"{span.name}: {key} is JSON text (Langfuse does not decode structured values)"
    return json.loads(value)


def test_a_whole_runs_content_has_the_conventions_message_and_tool_definition_structure(spans):
    agent = Agent(MODEL, tools=Inventory().tools(), client=ScriptedModel(equipment_script()), name="booking",
                  system="Book things.", tracer_provider=spans.provider)
    agent.run(continued_history())

    root = spans.one("invoke_agent")
    InputMessages.model_validate(content_of(root, sc.GEN_AI_INPUT_MESSAGES))
    OutputMessages.model_validate(content_of(root, sc.GEN_AI_OUTPUT_MESSAGES))
    validate_system_instructions(content_of(root, sc.GEN_AI_SYSTEM_INSTRUCTIONS))
    validate_tool_definitions(content_of(root, sc.GEN_AI_TOOL_DEFINITIONS))
    chats = spans.named("chat ")
    assert len(chats) == 4
    for chat in chats:
        InputMessages.model_validate(content_of(chat, sc.GEN_AI_INPUT_MESSAGES))
        OutputMessages.model_validate(content_of(chat, sc.GEN_AI_OUTPUT_MESSAGES))
    # The run's instructions and tools are on its root once; Langfuse gets them on every generation (its mapping).
    for chat in [s for s in spans.sent_to_langfuse if s.name.startswith("chat ")]:
        validate_system_instructions(content_of(chat, sc.GEN_AI_SYSTEM_INSTRUCTIONS))
        validate_tool_definitions(content_of(chat, sc.GEN_AI_TOOL_DEFINITIONS))

    # What the structure does not say by itself: the Anthropic blocks became the conventions' parts.
    first_input = content_of(root, sc.GEN_AI_INPUT_MESSAGES)
    assert [part["type"] for message in first_input for part in message["parts"]] == [
        "text", "blob", "reasoning", "tool_call", "tool_call_response", "text", "text"]
    assert first_input[0]["parts"][1] == {"type": "blob", "modality": "image", "mime_type": "image/png",
                                          "content": "iVBORw0KGgo="}


def test_the_same_content_reads_as_the_opentelemetry_genai_utilities_types(spans):
    """Cross-check with the OpenTelemetry GenAI utilities' own message types (opentelemetry-util-genai)."""
    genai_types = pytest.importorskip("opentelemetry.util.genai.types")
    from pydantic import TypeAdapter

    agent = Agent(MODEL, tools=Inventory().tools(), client=ScriptedModel(equipment_script()), name="booking",
                  system="Book things.", tracer_provider=spans.provider)
    agent.run(continued_history())
    inputs = TypeAdapter(list[genai_types.InputMessage])
    outputs = TypeAdapter(list[genai_types.OutputMessage])
    definitions = TypeAdapter(list[genai_types.FunctionToolDefinition])
    for span in [spans.sent("invoke_agent"), *[s for s in spans.sent_to_langfuse if s.name.startswith("chat ")]]:
        for message in [*inputs.validate_python(content_of(span, sc.GEN_AI_INPUT_MESSAGES)),
                        *outputs.validate_python(content_of(span, sc.GEN_AI_OUTPUT_MESSAGES))]:
            # Every part is one of the specific types, none fell back to the deprecated generic one.
            assert not any(isinstance(part, genai_types.GenericPart) for part in message.parts), message
        for output in outputs.validate_python(content_of(span, sc.GEN_AI_OUTPUT_MESSAGES)):
            assert output.finish_reason is None  # deprecated inside the message; on the span instead
        assert set(span.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS]) <= {"stop", "tool_call"}
        assert [d.name for d in definitions.validate_python(content_of(span, sc.GEN_AI_TOOL_DEFINITIONS))] == [
            "search_equipment", "reserve_equipment"]


def test_the_root_span_has_the_finish_reason_of_the_last_response_beside_its_output_message(spans):
    script = [{"stop_reason": "max_tokens", "content": [{"type": "text", "text": "The answer is"}]}]
    Agent(MODEL, client=ScriptedModel(script), tracer_provider=spans.provider).run("x")
    root = spans.one("invoke_agent")
    [output] = content_of(root, sc.GEN_AI_OUTPUT_MESSAGES)
    assert output == {"role": "assistant", "parts": [{"type": "text", "content": "The answer is"}]}
    assert root.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)


def test_continuing_a_history_records_all_of_it_as_the_runs_input(spans):
    Agent(MODEL, client=ScriptedModel([{"content": [{"type": "text", "text": "Booked."}]}]),
          tracer_provider=spans.provider).run(continued_history())
    root = spans.one("invoke_agent")
    assert [m["role"] for m in content_of(root, sc.GEN_AI_INPUT_MESSAGES)] == ["user", "assistant", "user",
                                                                              "assistant", "user"]
    # The readable one-line input Phoenix and Langfuse show, added by their mapping at export.
    assert spans.sent("invoke_agent").attributes[sc.INPUT_VALUE] == "Yes, a projector for 2026-10-08."


def test_the_system_prompt_and_tool_definitions_are_on_the_root_once_and_on_every_generation_langfuse_gets(spans):
    run_story(spans)
    root = spans.one("invoke_agent").attributes
    for chat in spans.named("chat "):  # the conventions allow them on the agent span: there, once per run
        assert sc.GEN_AI_SYSTEM_INSTRUCTIONS not in chat.attributes and sc.GEN_AI_TOOL_DEFINITIONS not in chat.attributes
    sent = [s for s in spans.sent_to_langfuse if s.name.startswith("chat ")]
    assert len(sent) == 4
    for chat in sent:  # Langfuse shows a generation's tools from the generation: its mapping puts them there
        assert chat.attributes[sc.GEN_AI_SYSTEM_INSTRUCTIONS] == root[sc.GEN_AI_SYSTEM_INSTRUCTIONS]
        assert chat.attributes[sc.GEN_AI_TOOL_DEFINITIONS] == root[sc.GEN_AI_TOOL_DEFINITIONS]


def test_sampling_parameters_and_stop_sequences_are_recorded(spans):
    Agent(MODEL, client=ScriptedModel([{"content": []}]), tracer_provider=spans.provider,
          model_params={"temperature": 0.2, "top_p": 0.9, "top_k": 40, "stop_sequences": ["END", "STOP"]}).run("x")
    a = spans.one("chat ").attributes
    assert (a[sc.GEN_AI_REQUEST_TEMPERATURE], a[sc.GEN_AI_REQUEST_TOP_P], a[sc.GEN_AI_REQUEST_TOP_K]) == (0.2, 0.9, 40)
    assert a[sc.GEN_AI_REQUEST_STOP_SEQUENCES] == ("END", "STOP")


def test_a_streaming_call_records_its_time_to_first_chunk(spans, monkeypatch):
    from fakes.messages_api import FakeMessagesAPI

    from looptrace.runtime import AnthropicModel

    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    with FakeMessagesAPI(equipment_script()[-1:]) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        streamed = Agent("claude-sonnet-5-5", client=AnthropicModel(stream=True),
                         tracer_provider=spans.provider).run("x")
    assert streamed.status is RunStatus.DONE
    chat = spans.one("chat ").attributes
    assert chat[sc.GEN_AI_REQUEST_STREAM] is True
    total = (spans.one("chat ").end_time - spans.one("chat ").start_time) / 1e9
    assert 0 < chat[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] <= total


def test_every_span_sent_has_its_openinference_kind_and_the_root_its_input_and_output(spans):
    result = run_story(spans)
    sent = spans.sent_to_langfuse
    kinds = {s.name.split(" ")[0]: s.attributes[sc.OPENINFERENCE_SPAN_KIND] for s in sent}
    assert kinds == {"invoke_agent": "AGENT", "turn": "CHAIN", "chat": "LLM", "execute_tool": "TOOL"}
    root = spans.sent("invoke_agent").attributes
    assert root[sc.INPUT_VALUE] == DEMO_TASK and root[sc.OUTPUT_VALUE] == result.final_text
    # Langfuse takes input.value/output.value over the GenAI content: on a tool or a generation they say the same
    # (tests/test_shipping.py compares the two views); a turn has neither.
    for span in [s for s in sent if s.name.startswith("execute_tool")]:
        assert span.attributes[sc.INPUT_VALUE] == span.attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS]
        assert span.attributes[sc.OUTPUT_VALUE] == span.attributes[sc.GEN_AI_TOOL_CALL_RESULT]
    for span in [s for s in sent if s.name.startswith("chat ")]:
        assert json.loads(span.attributes[sc.INPUT_VALUE])[1:] == json.loads(span.attributes[sc.GEN_AI_INPUT_MESSAGES])
        assert span.attributes[sc.OUTPUT_VALUE] == span.attributes[sc.GEN_AI_OUTPUT_MESSAGES]
    assert not any(sc.INPUT_VALUE in s.attributes or sc.OUTPUT_VALUE in s.attributes
                   for s in sent if s.name.startswith("turn"))


def test_the_spans_themselves_carry_no_backends_attributes(spans):
    """An application's processors (and the trace file) get the conventions and looptrace.* once: Langfuse's and
    OpenInference's attributes are added by the exporters that send to them."""
    Agent(MODEL, tools=Inventory().tools(), client=ScriptedModel(equipment_script()), system="Book things.",
          tracer_provider=spans.provider).run(DEMO_TASK, user_id="ana", tags=["demo"], metadata={"ticket": "T-9"})
    vendor = [(s.name, k) for s in spans.all for k in s.attributes
              if k.startswith(("langfuse.", "openinference.", "input.", "output.", "llm.", "session.id"))]
    assert spans.all and vendor == []
    root = spans.one("invoke_agent").attributes  # the labels, in neutral form, on the root alone
    assert (root[sc.USER_ID], list(root[sc.RUN_TAGS]), root[sc.RUN_METADATA_PREFIX + "ticket"]) == ("ana", ["demo"],
                                                                                                  "T-9")
    assert not any(sc.USER_ID in s.attributes for s in spans.all if s.parent is not None)


def test_an_anomaly_is_an_evaluation_result_event_with_ours_beside_it(spans):
    from looptrace.cli.demo import runaway_script

    Agent(MODEL, tools=Inventory().tools(), client=ScriptedModel(runaway_script()), on_anomaly="warn",
          limits=Limits(max_turns=4), tracer_provider=spans.provider).run("x")
    flagged = [(s, e) for s in spans.all for e in s.events if e.name == "gen_ai.evaluation.result"]
    assert flagged and {s.name.split(" ")[0] for s, _ in flagged} == {"turn", "execute_tool"}
    _, event = flagged[0]
    assert event.attributes["gen_ai.evaluation.name"] == "loop_anomaly"
    assert event.attributes["gen_ai.evaluation.score.label"] == "repeated_call"
    assert "search_equipment" in event.attributes["gen_ai.evaluation.explanation"]
    assert event.attributes[sc.ANOMALY_TYPE] == "repeated_call" and sc.ANOMALY_COUNT in event.attributes


def test_a_run_under_an_outer_span_is_marked_as_its_traces_root_in_langfuse(spans):
    outer = spans.provider.get_tracer("the-app")
    with outer.start_as_current_span("handle request"):
        Agent(MODEL, client=ScriptedModel([{"content": [{"type": "text", "text": "done"}]}]),
              tracer_provider=spans.provider).run("do it")
    root = spans.sent("invoke_agent").attributes
    assert root["langfuse.internal.as_root"] is True
    assert (root["langfuse.trace.input"], root["langfuse.trace.output"]) == ("do it", "done")


def test_a_run_of_its_own_needs_no_root_marker(spans):
    Agent(MODEL, client=ScriptedModel([{"content": [{"type": "text", "text": "done"}]}]),
          tracer_provider=spans.provider).run("do it")
    assert not any(k.startswith(("langfuse.internal", "langfuse.trace.input", "langfuse.trace.output"))
                   for k in spans.sent("invoke_agent").attributes)


def test_an_agent_run_as_another_agents_tool_is_not_a_root(spans):
    inner = Agent(MODEL, client=ScriptedModel([{"content": [{"type": "text", "text": "inner done"}]}]),
                  name="inner", tracer_provider=spans.provider)

    @tool
    def delegate(task: str) -> str:
        """Hand a task to the inner agent."""
        return inner.run(task).final_text

    script = [{"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "t1", "name": "delegate",
                                                       "input": {"task": "sub"}}]}, {"content": []}]
    Agent(MODEL, tools=[delegate], client=ScriptedModel(script), name="outer", tracer_provider=spans.provider).run("x")
    assert "langfuse.internal.as_root" not in spans.sent("invoke_agent inner").attributes


# --- content capture modes (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT) ----------------------------------

CONTENT_KEYS = {sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES, sc.GEN_AI_SYSTEM_INSTRUCTIONS,
                sc.GEN_AI_TOOL_DEFINITIONS, sc.GEN_AI_TOOL_CALL_ARGUMENTS, sc.GEN_AI_TOOL_CALL_RESULT,
                sc.INPUT_VALUE, sc.OUTPUT_VALUE}


def content_where(spans):
    on_spans = any(CONTENT_KEYS & set(s.attributes) for s in spans.all)
    in_events = any(e.name == "gen_ai.client.inference.operation.details" for s in spans.all for e in s.events)
    return on_spans, in_events


@pytest.mark.parametrize("value, on_spans, in_events", [
    (None, True, False),  # on by default, as in the Langfuse SDK and OpenLLMetry
    ("SPAN_ONLY", True, False), ("span_only", True, False),
    ("EVENT_ONLY", False, True), ("SPAN_AND_EVENT", True, True), ("NO_CONTENT", False, False),
    ("true", True, False), ("false", False, False),
    ("sometimes", False, False),  # unknown: nothing, as the GenAI utilities do, with a warning
])
def test_the_capture_setting_decides_where_content_goes(spans, monkeypatch, value, on_spans, in_events):
    if value is not None:
        monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", value)
    run_story(spans)
    assert content_where(spans) == (on_spans, in_events)
    assert all(sc.TOOL_RESULT_DIGEST in s.attributes for s in spans.named("execute_tool"))  # always, for detection


@pytest.mark.parametrize("value", ["NO_CONTENT", "SPAN_ONLY", "EVENT_ONLY", "SPAN_AND_EVENT", "span_and_event"])
def test_named_modes_mean_what_the_genai_utilities_say(monkeypatch, value):
    utils = pytest.importorskip("opentelemetry.util.genai.utils")
    from looptrace.instrumentation.recording.content import resolve_capture
    from looptrace.instrumentation.settings import Settings

    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", value)
    assert resolve_capture(Settings.from_env().capture_setting).name == utils.get_content_capturing_mode().name


def test_event_only_puts_each_calls_content_on_its_event(spans, monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "EVENT_ONLY")
    run_story(spans)
    chat = min(spans.named("chat "), key=lambda s: s.start_time)
    [event] = [e for e in chat.events if e.name == "gen_ai.client.inference.operation.details"]
    InputMessages.model_validate(json.loads(event.attributes[sc.GEN_AI_INPUT_MESSAGES]))
    OutputMessages.model_validate(json.loads(event.attributes[sc.GEN_AI_OUTPUT_MESSAGES]))
    assert json.loads(event.attributes[sc.GEN_AI_SYSTEM_INSTRUCTIONS]) == [{"type": "text", "content": "Book things."}]


@pytest.mark.parametrize("capture_content", [True, False])
def test_no_span_is_dropped_by_the_langfuse_sdks_default_export_filter(spans, capture_content):
    # An application exporting through Langfuse's own SDK keeps only spans with a gen_ai.* attribute (or from a known
    # instrumentation): every span of a run must pass, whatever content capture is.
    from langfuse.span_filter import is_default_export_span

    run_story(spans, capture_content=capture_content)
    assert spans.all and [s.name for s in spans.all if not is_default_export_span(s)] == []
