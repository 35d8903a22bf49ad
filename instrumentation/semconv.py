"""Every attribute, event, span and metric name looptrace emits, in one place.

GenAI names come from opentelemetry-semantic-conventions (its incubating module is where the gen_ai.* constants live
until they are declared stable); the looptrace.* names are ours. Run totals use looptrace.usage.* rather than
gen_ai.usage.*, because backends such as Langfuse read gen_ai.usage.* as "this span consumed tokens" and would count
the run's totals a second time on top of its generations.
"""

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as _gen_ai
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
ERROR_TYPE = _error.ERROR_TYPE
SERVER_ADDRESS = _server.SERVER_ADDRESS
SERVER_PORT = _server.SERVER_PORT

OPERATION_INVOKE_AGENT = _gen_ai.GenAiOperationNameValues.INVOKE_AGENT.value
OPERATION_CHAT = _gen_ai.GenAiOperationNameValues.CHAT.value
OPERATION_EXECUTE_TOOL = _gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value
PROVIDER_ANTHROPIC = _gen_ai.GenAiProviderNameValues.ANTHROPIC.value
TOOL_TYPE_FUNCTION = "function"  # the conventions' value for a client-side function tool (no enum constant yet)

# --- looptrace's own ------------------------------------------------------------------------------------------------
RUN_STATUS = "looptrace.run.status"
RUN_TURNS = "looptrace.run.turns"
RUN_COST_USD = "looptrace.run.cost_usd"
RUN_ERROR = "looptrace.run.error"
RUN_ANOMALY_COUNT = "looptrace.run.anomaly_count"
RUN_USAGE_INPUT_TOKENS = "looptrace.usage.input_tokens"  # Anthropic's input_tokens, cache excluded
RUN_USAGE_OUTPUT_TOKENS = "looptrace.usage.output_tokens"
RUN_USAGE_CACHE_READ_TOKENS = "looptrace.usage.cache_read_input_tokens"
RUN_USAGE_CACHE_CREATION_TOKENS = "looptrace.usage.cache_creation_input_tokens"
RUN_USAGE_TOTAL_TOKENS = "looptrace.usage.total_tokens"  # what the token budget counts
TURN_INDEX = "looptrace.turn.index"
STOP_REASON = "looptrace.anthropic.stop_reason"  # the raw value, beside the normalised finish reason
CHAT_COST_USD = "looptrace.chat.cost_usd"
INPUT_MESSAGES_OMITTED = "looptrace.chat.input_messages_omitted"  # older messages left out of gen_ai.input.messages
TOOL_RESULT_DIGEST = "looptrace.tool.result_digest"  # recorded even without content capture: the detector needs it
TOOL_ARGUMENTS_DIGEST = "looptrace.tool.arguments_digest"  # of the canonical, redacted arguments; likewise always
TOOL_IS_ERROR = "looptrace.tool.is_error"
TOOL_OUTCOME = "looptrace.tool.outcome"  # ok | error | timeout | invalid_arguments | unknown_tool
TOOL_RESULT_CHARS = "looptrace.tool.result_chars"  # the full length, before any truncation
REPAIRED_ATTRIBUTES = "looptrace.repaired_attributes"  # keys whose values could not be written as they were

ANOMALY_EVENT = "looptrace.anomaly"  # span event on the turn span and on each offending tool span
ANOMALY_TYPE = "looptrace.anomaly.type"
ANOMALY_MESSAGE = "looptrace.anomaly.message"
ANOMALY_COUNT = "looptrace.anomaly.count"
ANOMALY_STREAK = "looptrace.anomaly.streak"
ANOMALY_ACTION = "looptrace.anomaly.action"  # warn | nudge | stop
ANOMALY_TOOL = "looptrace.anomaly.tool"
ANOMALY_ARGUMENTS = "looptrace.anomaly.arguments"
JUDGE = "looptrace.judge"  # true on the span of a judge's model call (runtime/judge.py), apart from the run's budget
JUDGE_COST_USD = "looptrace.judge.cost_usd"
JUDGE_VERDICT = "looptrace.judge.verdict"  # "true" (ignored), "false" (not ignored) or "none"
NUDGE_TEXT = "looptrace.nudge"  # on the turn span: the corrective text the model was sent

# OpenLLMetry's indexed prompt and completion attributes (before 0.56), which readers.py takes apart.
OPENLLMETRY_PROMPT_PREFIX = "gen_ai.prompt."
OPENLLMETRY_COMPLETION_PREFIX = "gen_ai.completion."

# Events other producers put on GenAI spans that looptrace's views show beside its own anomaly events.
GEN_AI_EVALUATION_RESULT_EVENT = "gen_ai.evaluation.result"
EVENT_MESSAGE = "message"

# --- Langfuse's OpenTelemetry attributes (what its OTLP ingestion maps onto traces and observations) ------------------
# Langfuse shows an observation's level and status message; WARNING makes an anomaly visible where it happened.
LANGFUSE_OBSERVATION_LEVEL = "langfuse.observation.level"
LANGFUSE_OBSERVATION_STATUS_MESSAGE = "langfuse.observation.status_message"
LANGFUSE_OBSERVATION_TYPE = "langfuse.observation.type"
LANGFUSE_OBSERVATION_USAGE_DETAILS = "langfuse.observation.usage_details"
LANGFUSE_OBSERVATION_COST_DETAILS = "langfuse.observation.cost_details"
LANGFUSE_TRACE_NAME = "langfuse.trace.name"
LANGFUSE_TRACE_TAGS = "langfuse.trace.tags"
LANGFUSE_TRACE_METADATA_PREFIX = "langfuse.trace.metadata."
LANGFUSE_ENVIRONMENT = "langfuse.environment"
LANGFUSE_RELEASE = "langfuse.release"
LANGFUSE_USER_ID = "user.id"
LANGFUSE_SESSION_ID = "session.id"
LANGFUSE_ANOMALY_SCORE = "loop_anomaly"  # the categorical score a loop anomaly adds to its trace

# --- metric names (instruments in metrics.py) ----------------------------------------------------------------------
# METRIC_TOKEN_USAGE and METRIC_OPERATION_DURATION: the GenAI conventions' names, looked up on first use (their module
# imports the OpenTelemetry metrics API, which `looptrace detect` and `traces` have no use for); see __getattr__.
METRIC_RUNS = "looptrace.runs"
METRIC_TURNS = "looptrace.turns"
METRIC_TOOL_CALLS = "looptrace.tool.calls"
METRIC_TOOL_DURATION = "looptrace.tool.duration"
METRIC_ANOMALIES = "looptrace.anomalies"
METRIC_COST = "looptrace.cost"

# --- span names ---------------------------------------------------------------------------------------------------


def agent_span_name(agent: str) -> str:
    return f"{OPERATION_INVOKE_AGENT} {agent}"


def turn_span_name(index: int) -> str:
    return f"turn {index}"


def chat_span_name(model: str) -> str:
    return f"{OPERATION_CHAT} {model}"


def tool_span_name(tool: str) -> str:
    return f"{OPERATION_EXECUTE_TOOL} {tool}"


# Anthropic's stop_reason as a GenAI finish reason, the way the OpenTelemetry Anthropic instrumentation reports it.
FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_call"}


def finish_reason(stop_reason: str | None) -> str:
    if stop_reason is None:
        return "error"
    return FINISH_REASONS.get(stop_reason, stop_reason)
