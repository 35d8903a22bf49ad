"""Every attribute, event, span and metric name looptrace's spans carry, in one place.

GenAI names come from opentelemetry-semantic-conventions (its incubating module is where the gen_ai.* constants live
until they are declared stable); the looptrace.* names are ours. Run totals use looptrace.usage.* rather than
gen_ai.usage.*, because backends such as Langfuse read gen_ai.usage.* as "this span consumed tokens" and would count
the run's totals a second time on top of its generations.

A vendor's own attributes are not here: each vendor's mapping names them (``langfuse.mapping`` Langfuse's), and its
exporter adds them to the spans it sends. OpenInference's few names are, since it is a convention other producers
write too and the readers read (``export.openinference`` maps looptrace's spans to it).
"""

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as _gen_ai
from opentelemetry.semconv._incubating.attributes import user_attributes as _user
from opentelemetry.semconv.attributes import error_attributes as _error
from opentelemetry.semconv.attributes import server_attributes as _server


def _installed_version() -> str:
    try:
        from importlib.metadata import version

        return version("looptrace")
    except Exception:  # running from a source tree that was never installed
        return "0.0.0"


# The instrumentation scope of every span and metric: looked up once, not per agent, and only when first used
# (importlib.metadata is slow to import, and `looptrace detect` never needs the version).
SCOPE_NAME = "looptrace"
MCP_SCOPE_NAME = "looptrace.mcp"  # the MCP client spans and metrics looptrace makes (mcp_tracing)


def __getattr__(name: str) -> str:
    if name == "SCOPE_VERSION":
        value = _installed_version()
    elif name in ("METRIC_TOKEN_USAGE", "METRIC_OPERATION_DURATION"):
        from opentelemetry.semconv._incubating.metrics import gen_ai_metrics

        value = {"METRIC_TOKEN_USAGE": gen_ai_metrics.GEN_AI_CLIENT_TOKEN_USAGE,
                 "METRIC_OPERATION_DURATION": gen_ai_metrics.GEN_AI_CLIENT_OPERATION_DURATION}[name]
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value

# --- OpenTelemetry GenAI semantic conventions ----------------------------------------------------------------------
GEN_AI_OPERATION_NAME = _gen_ai.GEN_AI_OPERATION_NAME
GEN_AI_PROVIDER_NAME = _gen_ai.GEN_AI_PROVIDER_NAME
GEN_AI_AGENT_NAME = _gen_ai.GEN_AI_AGENT_NAME
GEN_AI_CONVERSATION_ID = _gen_ai.GEN_AI_CONVERSATION_ID
GEN_AI_REQUEST_MODEL = _gen_ai.GEN_AI_REQUEST_MODEL
GEN_AI_REQUEST_MAX_TOKENS = _gen_ai.GEN_AI_REQUEST_MAX_TOKENS
GEN_AI_REQUEST_TEMPERATURE = _gen_ai.GEN_AI_REQUEST_TEMPERATURE
GEN_AI_REQUEST_STREAM = _gen_ai.GEN_AI_REQUEST_STREAM
GEN_AI_RESPONSE_MODEL = _gen_ai.GEN_AI_RESPONSE_MODEL
GEN_AI_RESPONSE_ID = _gen_ai.GEN_AI_RESPONSE_ID
GEN_AI_RESPONSE_FINISH_REASONS = _gen_ai.GEN_AI_RESPONSE_FINISH_REASONS
GEN_AI_USAGE_INPUT_TOKENS = _gen_ai.GEN_AI_USAGE_INPUT_TOKENS
GEN_AI_USAGE_OUTPUT_TOKENS = _gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = _gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS = _gen_ai.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS
GEN_AI_INPUT_MESSAGES = _gen_ai.GEN_AI_INPUT_MESSAGES
GEN_AI_OUTPUT_MESSAGES = _gen_ai.GEN_AI_OUTPUT_MESSAGES
GEN_AI_SYSTEM_INSTRUCTIONS = _gen_ai.GEN_AI_SYSTEM_INSTRUCTIONS
GEN_AI_TOOL_DEFINITIONS = _gen_ai.GEN_AI_TOOL_DEFINITIONS
GEN_AI_TOOL_NAME = _gen_ai.GEN_AI_TOOL_NAME
GEN_AI_TOOL_CALL_ID = _gen_ai.GEN_AI_TOOL_CALL_ID
GEN_AI_TOOL_TYPE = _gen_ai.GEN_AI_TOOL_TYPE
GEN_AI_TOOL_DESCRIPTION = _gen_ai.GEN_AI_TOOL_DESCRIPTION
GEN_AI_TOOL_CALL_ARGUMENTS = _gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS
GEN_AI_TOOL_CALL_RESULT = _gen_ai.GEN_AI_TOOL_CALL_RESULT
GEN_AI_REQUEST_TOP_P = _gen_ai.GEN_AI_REQUEST_TOP_P
GEN_AI_REQUEST_TOP_K = _gen_ai.GEN_AI_REQUEST_TOP_K
GEN_AI_REQUEST_STOP_SEQUENCES = _gen_ai.GEN_AI_REQUEST_STOP_SEQUENCES
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK = _gen_ai.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK  # seconds, streaming calls only
# With content capture EVENT_ONLY or SPAN_AND_EVENT, a chat call's content goes on this event (the GenAI utilities'
# name for it), as JSON text in the same attributes the span would carry.
CONTENT_EVENT = "gen_ai.client.inference.operation.details"
# The conventions' verdict on an output: the event an anomaly is also recorded as (gen-ai-events, v1.41).
EVALUATION_RESULT_EVENT = "gen_ai.evaluation.result"
GEN_AI_EVALUATION_NAME = _gen_ai.GEN_AI_EVALUATION_NAME
GEN_AI_EVALUATION_SCORE_LABEL = _gen_ai.GEN_AI_EVALUATION_SCORE_LABEL
GEN_AI_EVALUATION_EXPLANATION = _gen_ai.GEN_AI_EVALUATION_EXPLANATION
USER_ID = _user.USER_ID  # a run's user, on its root span (Langfuse reads it as the trace's user)
ERROR_TYPE = _error.ERROR_TYPE
SERVER_ADDRESS = _server.SERVER_ADDRESS
SERVER_PORT = _server.SERVER_PORT

OPERATION_INVOKE_AGENT = _gen_ai.GenAiOperationNameValues.INVOKE_AGENT.value
OPERATION_CHAT = _gen_ai.GenAiOperationNameValues.CHAT.value
OPERATION_EXECUTE_TOOL = _gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value
PROVIDER_ANTHROPIC = _gen_ai.GenAiProviderNameValues.ANTHROPIC.value
TOOL_TYPE_FUNCTION = "function"  # the conventions' value for a client-side function tool (no enum constant yet)

# --- OpenInference (Phoenix, Arize) -------------------------------------------------------------------------------
# Phoenix shows a span's kind from openinference.span.kind and its Input and Output from input.value and output.value
# alone (rendered as JSON when their mime type says so), whatever gen_ai.* the span has. Langfuse reads the same pair
# before gen_ai.*. Never written by the spans: the exporters that ask for OpenInference's view add them
# (export/openinference.py). Names as in openinference-semantic-conventions.
OPENINFERENCE_SPAN_KIND = "openinference.span.kind"
INPUT_VALUE = "input.value"
OUTPUT_VALUE = "output.value"
INPUT_MIME_TYPE = "input.mime_type"
OUTPUT_MIME_TYPE = "output.mime_type"
MIME_JSON = "application/json"
SPAN_KIND_AGENT, SPAN_KIND_CHAIN, SPAN_KIND_LLM, SPAN_KIND_TOOL = "AGENT", "CHAIN", "LLM", "TOOL"

# --- looptrace's own ------------------------------------------------------------------------------------------------
RUN_STATUS = "looptrace.run.status"
RUN_TURNS = "looptrace.run.turns"
RUN_COST_USD = "looptrace.run.cost_usd"
RUN_ERROR = "looptrace.run.error"
RUN_ANOMALY_COUNT = "looptrace.run.anomaly_count"
RUN_UNRESOLVED_TOOL_ERRORS = "looptrace.run.unresolved_tool_errors"  # tool errors standing when the run ended
RUN_UNRESOLVED_TOOLS = "looptrace.run.unresolved_tool_errors.tools"  # their tools, oldest first (names, no content)
# One event on the root span per unresolved error (the most recent, capped): what `traces show` reads back.
UNRESOLVED_TOOL_ERROR_EVENT = "looptrace.unresolved_tool_error"
UNRESOLVED_TURN = "looptrace.unresolved_tool_error.turn"
UNRESOLVED_FAILURES = "looptrace.unresolved_tool_error.failures"
UNRESOLVED_TARGET = "looptrace.unresolved_tool_error.target"  # content: only when content is captured
UNRESOLVED_ERROR = "looptrace.unresolved_tool_error.error"  # content, secrets redacted: only when captured
# How the model dealt with it, when it did: "answer", "model" (beside a later call), "handed on" (a later call)
UNRESOLVED_REPORTED = "looptrace.unresolved_tool_error.reported"
RUN_USAGE_INPUT_TOKENS = "looptrace.usage.input_tokens"  # Anthropic's input_tokens, cache excluded
RUN_USAGE_OUTPUT_TOKENS = "looptrace.usage.output_tokens"
RUN_USAGE_CACHE_READ_TOKENS = "looptrace.usage.cache_read_input_tokens"
RUN_USAGE_CACHE_CREATION_TOKENS = "looptrace.usage.cache_creation_input_tokens"
RUN_USAGE_TOTAL_TOKENS = "looptrace.usage.total_tokens"  # what the token budget counts
# A run's labels beside the session (gen_ai.conversation.id) and the user (user.id), on its root span only: a
# backend that wants them on every span (Langfuse) gets them there from its mapping at export.
RUN_TAGS = "looptrace.run.tags"
RUN_METADATA_PREFIX = "looptrace.run.metadata."  # + the key; the value as text
TURN_INDEX = "looptrace.turn.index"
STOP_REASON = "looptrace.anthropic.stop_reason"  # the raw value, beside the normalised finish reason
CHAT_COST_USD = "looptrace.chat.cost_usd"
INPUT_MESSAGES_OMITTED = "looptrace.chat.input_messages_omitted"  # older messages left out of gen_ai.input.messages
CHAT_CACHE_WRITES_1H = "looptrace.chat.cache_creation_1h_input_tokens"  # the cache writes kept an hour (if any)
# In the trace file only: a model call whose input messages continue what an earlier span of its run recorded holds
# the new messages alone, and names that span (tracefile/history.py writes and restores it).
INPUT_CONTINUES = "looptrace.chat.input_continues"
INPUT_CONTINUES_FROM = "looptrace.chat.input_continues_from"  # characters of it left out, once the window moved on
# In the trace file only: the resource a line's spans belong to, written whole on a writer's first line of a file.
RESOURCE_ID = "looptrace.resource.id"
TOOL_RESULT_DIGEST = "looptrace.tool.result_digest"  # recorded even without content capture: the detector needs it
TOOL_ARGUMENTS_DIGEST = "looptrace.tool.arguments_digest"  # of the canonical, redacted arguments; likewise always
TOOL_IS_ERROR = "looptrace.tool.is_error"
# ok | error | timeout | invalid_arguments | unknown_tool | rejected | awaiting_approval
TOOL_OUTCOME = "looptrace.tool.outcome"
TOOL_RESULT_CHARS = "looptrace.tool.result_chars"  # the full length, before any truncation
# A call that needed approval: pending (its run paused), approved or rejected; by "approver" (in process) or "person"
# (on resume); the reason of a rejection (content: only with capture on); seconds it waited for the decision.
TOOL_APPROVAL = "looptrace.tool.approval"
TOOL_APPROVAL_BY = "looptrace.tool.approval.by"
TOOL_APPROVAL_REASON = "looptrace.tool.approval.reason"
TOOL_APPROVAL_WAIT_S = "looptrace.tool.approval.wait_s"
# A resumed run: the trace of the paused run it continues (also a span link from its root to that run's root).
RUN_RESUMES_TRACE_ID = "looptrace.run.resumes_trace_id"
REPAIRED_ATTRIBUTES = "looptrace.repaired_attributes"  # keys whose values could not be written as they were

# An anomaly is a span event on the turn span and on each offending tool span: the conventions' evaluation result
# (gen_ai.evaluation.name/score.label/explanation) with the looptrace.anomaly.* attributes beside them. Traces
# written before this was so name the event "looptrace.anomaly"; readers accept both.
ANOMALY_EVENT = EVALUATION_RESULT_EVENT
LEGACY_ANOMALY_EVENT = "looptrace.anomaly"
ANOMALY_TYPE = "looptrace.anomaly.type"
ANOMALY_MESSAGE = "looptrace.anomaly.message"
ANOMALY_COUNT = "looptrace.anomaly.count"
ANOMALY_STREAK = "looptrace.anomaly.streak"
ANOMALY_ACTION = "looptrace.anomaly.action"  # warn | nudge | stop
ANOMALY_TOOL = "looptrace.anomaly.tool"
ANOMALY_ARGUMENTS = "looptrace.anomaly.arguments"
# What the anomaly's loop cost so far, from its first repeated turn (`LoopCost`): on the anomaly event.
ANOMALY_COST_USD = "looptrace.anomaly.cost_usd"  # left out when a model call in it had no price...
ANOMALY_COST_UNPRICED = "looptrace.anomaly.cost_unpriced"  # ...and this says why
ANOMALY_INPUT_TOKENS = "looptrace.anomaly.input_tokens"  # cache reads and writes included
ANOMALY_OUTPUT_TOKENS = "looptrace.anomaly.output_tokens"
ANOMALY_TOTAL_TOKENS = "looptrace.anomaly.total_tokens"
ANOMALY_TURNS = "looptrace.anomaly.turns"  # model calls in the loop
ANOMALY_DURATION_S = "looptrace.anomaly.duration_s"
ANOMALY_SINCE_TURN = "looptrace.anomaly.since_turn"
# The run's and the session's loop cost on the root span: the turns that belonged to a loop, each counted once.
RUN_LOOP_COST_USD = "looptrace.run.loop.cost_usd"
RUN_LOOP_INPUT_TOKENS = "looptrace.run.loop.input_tokens"
RUN_LOOP_OUTPUT_TOKENS = "looptrace.run.loop.output_tokens"
RUN_LOOP_TOTAL_TOKENS = "looptrace.run.loop.total_tokens"
RUN_LOOP_TURNS = "looptrace.run.loop.turns"
SESSION_LOOP_COST_USD = "looptrace.session.loop.cost_usd"
SESSION_LOOP_INPUT_TOKENS = "looptrace.session.loop.input_tokens"
SESSION_LOOP_OUTPUT_TOKENS = "looptrace.session.loop.output_tokens"
SESSION_LOOP_TOTAL_TOKENS = "looptrace.session.loop.total_tokens"
SESSION_LOOP_TURNS = "looptrace.session.loop.turns"
JUDGE = "looptrace.judge"  # true on the span of a judge's model call (runtime/judge.py), apart from the run's budget
JUDGE_COST_USD = "looptrace.judge.cost_usd"
JUDGE_VERDICT = "looptrace.judge.verdict"  # "true" (ignored), "false" (not ignored) or "none"
NUDGE_TEXT = "looptrace.nudge"  # on the turn span: the corrective text the model was sent

# OpenLLMetry's indexed prompt and completion attributes (before 0.56), which readers.py takes apart.
OPENLLMETRY_PROMPT_PREFIX = "gen_ai.prompt."
OPENLLMETRY_COMPLETION_PREFIX = "gen_ai.completion."

# Events other producers put on GenAI spans that looptrace's views show beside its own anomaly events.
GEN_AI_EVALUATION_RESULT_EVENT = EVALUATION_RESULT_EVENT
EVENT_MESSAGE = "message"

ANOMALY_EVALUATION_NAME = "loop_anomaly"  # gen_ai.evaluation.name of an anomaly's evaluation event
# Older trace files carried Langfuse's usage object on each generation; replay reads its 1-hour cache writes there.
LEGACY_LANGFUSE_USAGE_DETAILS = "langfuse.observation.usage_details"

# --- metric names (instruments in metrics.py) ----------------------------------------------------------------------
# METRIC_TOKEN_USAGE and METRIC_OPERATION_DURATION: the GenAI conventions' names, looked up on first use (their module
# imports the OpenTelemetry metrics API, which `looptrace detect` and `traces` have no use for); see __getattr__.
METRIC_RUNS = "looptrace.runs"
METRIC_TURNS = "looptrace.turns"
METRIC_TOOL_CALLS = "looptrace.tool.calls"
METRIC_TOOL_DURATION = "looptrace.tool.duration"
METRIC_ANOMALIES = "looptrace.anomalies"
METRIC_COST = "looptrace.cost"
METRIC_LOOP_COST = "looptrace.loop.cost"  # USD burned by loops, by anomaly type and agent
METRIC_APPROVALS = "looptrace.approvals"  # calls that needed approval, by decision: pending, approved, rejected
METRIC_APPROVAL_WAIT = "looptrace.approval.wait"  # seconds from the call's request to its decision

# --- span names ---------------------------------------------------------------------------------------------------


def agent_span_name(agent: str) -> str:
    return f"{OPERATION_INVOKE_AGENT} {agent}"


TURN_SPAN_NAME = "turn"  # one name for every turn: the index is an attribute, so span metrics get one series


def turn_span_name(index: int | None = None) -> str:
    return TURN_SPAN_NAME


def chat_span_name(model: str) -> str:
    return f"{OPERATION_CHAT} {model}"


def tool_span_name(tool: str) -> str:
    return f"{OPERATION_EXECUTE_TOOL} {tool}"


# Anthropic's stop_reason as a GenAI finish reason, the way the OpenTelemetry Anthropic instrumentation reports it.
# A refusal is the conventions' well-known content_filter; pause_turn and newer reasons pass through as they are.
FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_call",
                  "refusal": "content_filter"}


def finish_reason(stop_reason: str | None) -> str:
    if stop_reason is None:
        return "error"
    return FINISH_REASONS.get(stop_reason, stop_reason)
