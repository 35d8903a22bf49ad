"""Every environment variable looptrace reads, read here, once, into one typed object.

``Settings.from_env()`` is the only place that looks at ``LOOPTRACE_*``, ``LANGFUSE_*`` and ``OTEL_*`` (plus the W3C
``TRACEPARENT``/``TRACESTATE`` a scheduler hands over). ``configure()``, ``Agent`` and the CLI take a ``Settings``; a
flag or an argument overrides one field with ``dataclasses.replace`` (see ``Settings.with_overrides``). The README's
configuration table lists exactly the variables named in ``VARIABLES`` (a test compares them).

Pure standard library, so that reading the configuration never loads the OpenTelemetry SDK.

A setting that cannot work is kept as a ``problem`` rather than raised here: an OTLP protocol the Python exporters do
not speak matters only when the OTLP exporter is built, and a library must not refuse to start over a variable meant
for another program. The factories raise ``ConfigurationError`` with the problem when they need the setting.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

__all__ = [
    "VARIABLES",
    "ConfigurationError",
    "LangfuseSettings",
    "OtlpSettings",
    "Settings",
    "parse_exporters",
]

DEFAULT_TIMEOUT_S = 10.0  # the specification's default OTEL_EXPORTER_OTLP_TIMEOUT (10000 ms)
DEFAULT_TRACE_FILE = Path(".looptrace") / "traces.jsonl"
DEFAULT_UNDELIVERED_FILE = Path(".looptrace") / "undelivered.jsonl"
# The trace file rotates past this size, keeping this many older files beside it (traces.jsonl.1 is the newest).
DEFAULT_TRACE_FILE_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_TRACE_FILE_BACKUPS = 8
DEFAULT_MAX_ATTRIBUTE_CHARS = 32_000
# The longest trace-file line read back; a longer one is skipped without being held (a file of any size is read in
# memory bounded by this). Never below 1 KiB, whatever the variable says.
DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024
MIN_MAX_LINE_BYTES = 1024
MAX_LINE_BYTES_VARIABLE = "LOOPTRACE_MAX_LINE_BYTES"
DEFAULT_MODEL = "claude-sonnet-5-5"
LANGFUSE_DEFAULT_BASE_URL = "https://cloud.langfuse.com"
LANGFUSE_TRACES_PATH = "/api/public/otel/v1/traces"

HTTP_PROTOBUF, GRPC = "http/protobuf", "grpc"
KNOWN_EXPORTERS = ("file", "console", "otlp", "langfuse", "none")
NETWORK_EXPORTERS = ("langfuse", "otlp")
# The backends' attribute mappings an OTLP exporter can be asked to add (LOOPTRACE_OTLP_MAPPINGS): for a collector
# that forwards to Langfuse (its mapping, with OpenInference's, which Langfuse reads too) or to Phoenix.
OTLP_MAPPINGS = ("langfuse", "openinference")
_SIGNAL_PATHS = {"traces": "v1/traces", "metrics": "v1/metrics"}
_DEFAULT_ENDPOINTS = {HTTP_PROTOBUF: "http://localhost:4318", GRPC: "http://localhost:4317"}
# Content capture: the OpenTelemetry GenAI utilities' modes, and the true/false of older GenAI instrumentations.
CAPTURE_MODES = ("NO_CONTENT", "SPAN_ONLY", "EVENT_ONLY", "SPAN_AND_EVENT")
_CAPTURE_TRUE, _CAPTURE_FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off", "none"}

# What each variable does; the README's configuration table names the same set. "[TRACES_|METRICS_]" stands for the
# three spellings the specification defines (generic, per traces, per metrics).
VARIABLES: dict[str, str] = {
    "LOOPTRACE_EXPORTER": "exporters: file, console, otlp, langfuse, none",
    "LOOPTRACE_OTLP_MAPPINGS": "backends' attributes the OTLP exporter adds: langfuse, openinference, none",
    "LOOPTRACE_TRACE_FILE": "the file exporter's path",
    "LOOPTRACE_TRACE_FILE_MAX_BYTES": "the trace file rotates past this size (default 64 MiB; 0: never)",
    "LOOPTRACE_TRACE_FILE_BACKUPS": "rotated trace files kept beside it (default 8)",
    "LOOPTRACE_UNDELIVERED_FILE": "the spans (by id) and scores a backend has not taken, for `looptrace traces push`",
    "LOOPTRACE_SPILL_FILE": "deprecated: the old name of LOOPTRACE_UNDELIVERED_FILE",
    "LOOPTRACE_PROMETHEUS_PORT": "serve metrics at /metrics on this port",
    "LOOPTRACE_MODEL": "`looptrace run`'s default model",
    "LOOPTRACE_JUDGE": "model that confirms ignored_error before it is reported (the detector's judge)",
    "LOOPTRACE_JUDGE_MAX_CALLS": "judge calls per run at most (default 3); the rest are left unjudged",
    "LOOPTRACE_CAPTURE_CONTENT": "the GenAI variable's values; wins over it",
    "LOOPTRACE_MAX_ATTRIBUTE_CHARS": "cap on each content attribute",
    MAX_LINE_BYTES_VARIABLE: "longest trace file or undelivered list line read back, bytes; longer ones are skipped",
    "LOOPTRACE_ALERT_WEBHOOK": "URL each new kind of anomaly is posted to",
    "LOOPTRACE_WATCH_TOKEN": "bearer token `looptrace watch` requires of senders",
    "LOOPTRACE_WATCH_USERNAME": "basic-auth user `looptrace watch` requires of senders",
    "LOOPTRACE_WATCH_PASSWORD": "basic-auth password `looptrace watch` requires of senders",
    "LANGFUSE_PUBLIC_KEY": "Langfuse project key",
    "LANGFUSE_SECRET_KEY": "Langfuse project key",
    "LANGFUSE_BASE_URL": "Langfuse host",
    "LANGFUSE_HOST": "Langfuse host (older name)",
    "LANGFUSE_TIMEOUT": "Langfuse export timeout, seconds",
    "LANGFUSE_TRACING_ENVIRONMENT": "Langfuse environment of traces and scores",
    "LANGFUSE_RELEASE": "Langfuse release of traces",
    "XDG_CACHE_HOME": "where the Langfuse project id of trace links is cached",
    "XDG_STATE_HOME": "where each resumed run is claimed, so that a paused run resumes once",
    "OTEL_SDK_DISABLED": "true switches telemetry off",
    "OTEL_TRACES_EXPORTER": "otlp, console or none",
    "OTEL_METRICS_EXPORTER": "none keeps metrics off OTLP",
    "OTEL_SERVICE_NAME": "service.name of the resource",
    "OTEL_RESOURCE_ATTRIBUTES": "the resource's attributes",
    "OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]ENDPOINT": "OTLP endpoint",
    "OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]PROTOCOL": "http/protobuf or grpc",
    "OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]HEADERS": "key=value pairs, comma separated",
    "OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]TIMEOUT": "milliseconds",
    "OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]COMPRESSION": "gzip, deflate or none",
    "OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]INSECURE": "gRPC without TLS",
    "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "cumulative (default), delta or lowmemory",
    "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": "explicit_bucket_histogram or "
                                                                "base2_exponential_bucket_histogram",
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY (default), EVENT_ONLY, SPAN_AND_EVENT, NO_CONTENT",
    "OTEL_BSP_SCHEDULE_DELAY": "batch span processor delay, ms",
    "OTEL_BSP_MAX_QUEUE_SIZE": "batch span processor queue",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "batch span processor batch size",
    "OTEL_BSP_EXPORT_TIMEOUT": "batch span processor export timeout, ms",
    "TRACEPARENT": "W3C trace context to join",
    "TRACESTATE": "W3C trace state to join",
}


def expand(name: str) -> list[str]:
    """``OTEL_X_[TRACES_|METRICS_]Y`` -> the three names it stands for; any other name -> itself."""
    match = re.fullmatch(r"(.*)\[([^\]]*)\](.*)", name)
    if not match:
        return [name]
    head, options, tail = match.groups()
    return [head + tail] + [head + option + tail for option in options.split("|")]


class ConfigurationError(ValueError):
    """A setting that cannot work, with what to do about it (never with a secret's value)."""


def safe_url(url: str) -> str:
    """The URL without user info, query or fragment: what may appear in a warning."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable endpoint>"
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", "")) if parts.scheme else url.split("?", 1)[0]


# --- reading ---------------------------------------------------------------------------------------------------------


class _Env:
    """The environment as settings read it: stripped values, empty meaning unset."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ

    def get(self, name: str) -> str | None:
        value = self._environ.get(name)
        if value is None:
            return None
        value = value.strip()
        return value or None

    def first(self, *names: str) -> tuple[str, str] | None:
        """The first of ``names`` that is set, with its value."""
        for name in names:
            value = self.get(name)
            if value is not None:
                return name, value
        return None


def parse_headers(value: str) -> tuple[dict[str, str], int]:
    """``key=value`` pairs separated by commas (values may be URL-encoded), as the OTLP exporter specification writes
    them. Returns the headers and how many entries were malformed (dropped). Never logs: the value may be a secret."""
    headers: dict[str, str] = {}
    malformed = 0
    for entry in value.split(","):
        if not entry.strip():
            continue
        name, equals, content = entry.partition("=")
        name = unquote(name).strip().lower()
        if not equals or not name or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9a-z-]+", name):
            malformed += 1
            continue
        headers[name] = unquote(content).strip()
    return headers, malformed


@dataclass(frozen=True)
class OtlpSettings:
    """Where and how one signal goes over OTLP, from the standard ``OTEL_EXPORTER_OTLP_*`` variables.

    ``problem`` says why these settings cannot work (an unsupported protocol, a malformed timeout or header list);
    the exporter factories raise it as a ``ConfigurationError``.
    """

    signal: str = "traces"
    endpoint: str = "http://localhost:4318/v1/traces"
    protocol: str = HTTP_PROTOBUF
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold credentials: never printed
    timeout_s: float = DEFAULT_TIMEOUT_S
    compression: str = "none"  # none | gzip | deflate
    insecure: bool | None = None  # gRPC only; None lets the exporter decide from the URL scheme
    endpoint_configured: bool = False  # an endpoint variable is set (what makes `otlp` a configured backend)
    problem: str | None = None
    # Metrics only: OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE and _DEFAULT_HISTOGRAM_AGGREGATION, lower case.
    temporality: str = "cumulative"
    histogram_aggregation: str = "explicit_bucket_histogram"

    @classmethod
    def from_env(cls, signal: str = "traces", environ: Mapping[str, str] | None = None) -> OtlpSettings:
        env = _Env(os.environ if environ is None else environ)
        specific = f"OTEL_EXPORTER_OTLP_{signal.upper()}_"
        problems: list[str] = []

        def setting(name: str) -> tuple[str, str] | None:
            return env.first(specific + name, "OTEL_EXPORTER_OTLP_" + name)

        protocol_variable, protocol = setting("PROTOCOL") or ("", HTTP_PROTOBUF)
        protocol = protocol.lower()
        if protocol not in (HTTP_PROTOBUF, GRPC):  # (a value is never repeated: it may be a token set by mistake)
            hint = " (the OpenTelemetry Python exporters have no http/json)" if protocol == "http/json" else ""
            problems.append(f"{protocol_variable} is not an OTLP protocol looptrace can send{hint}; use "
                            "http/protobuf or grpc")
            protocol = HTTP_PROTOBUF
        own_endpoint = env.get(specific + "ENDPOINT")
        generic = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if own_endpoint:
            endpoint = own_endpoint
        else:
            base = (generic or _DEFAULT_ENDPOINTS[protocol]).rstrip("/")
            # The specification appends the signal path to the generic endpoint for HTTP only; gRPC has no paths.
            endpoint = f"{base}/{_SIGNAL_PATHS[signal]}" if protocol == HTTP_PROTOBUF else base
        if own_endpoint or generic:
            variable = specific + "ENDPOINT" if own_endpoint else "OTEL_EXPORTER_OTLP_ENDPOINT"
            unusable = _endpoint_problem(variable, own_endpoint or generic or "", protocol)
            if unusable:
                problems.append(unusable)
        compression_variable, compression = setting("COMPRESSION") or ("", "none")
        compression = compression.lower()
        if compression not in ("none", "gzip", "deflate"):
            problems.append(f"{compression_variable} is not an OTLP compression looptrace supports; use gzip, "
                            "deflate or none")
            compression = "none"
        headers: dict[str, str] = {}
        found = setting("HEADERS")
        if found is not None:
            variable, raw = found
            headers, malformed = parse_headers(raw)
            if malformed:
                # The value is not repeated: a header list usually carries a token.
                problems.append(f"{variable} is malformed ({malformed} entr{'y' if malformed == 1 else 'ies'} not "
                                f"key=value): write it as key=value pairs separated by commas, with spaces "
                                f"URL-encoded, e.g. Authorization=Bearer%20<token>")
        timeout_s = DEFAULT_TIMEOUT_S
        found = setting("TIMEOUT")
        if found is not None:
            try:
                timeout_s = _milliseconds_as_seconds(*found)
            except ConfigurationError as error:
                problems.append(str(error))
        insecure = setting("INSECURE")
        temporality = (env.get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE") or "cumulative").strip().lower()
        histogram = (env.get("OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION")
                     or "explicit_bucket_histogram").strip().lower()
        return cls(signal=signal, endpoint=endpoint, protocol=protocol, headers=headers, timeout_s=timeout_s,
                   compression=compression, insecure=None if insecure is None else insecure[1].lower() == "true",
                   endpoint_configured=bool(own_endpoint or generic), problem="; ".join(problems) or None,
                   temporality=temporality, histogram_aggregation=histogram)

    def check(self) -> OtlpSettings:
        """These settings, or ConfigurationError when they cannot work."""
        if self.problem:
            raise ConfigurationError(self.problem)
        return self


def http_url_problem(variable: str, url: str, example: str) -> str | None:
    """Why ``url`` (the value of ``variable``) is not an http(s) URL with a host, naming the variable and showing
    ``example`` (never the value: it may be a credential set by mistake); None when it is one."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port  # .port raises for a port that is not a number
    except ValueError:
        return f"{variable} is not a URL; write it as {example}"
    if parts.scheme in ("http", "https") and host:
        return None
    missing = "http:// or https://" if parts.scheme not in ("http", "https") else "a host"
    return f"{variable} is not a URL (it has no {missing}); write it as {example}"


def _endpoint_problem(variable: str, endpoint: str, protocol: str) -> str | None:
    """Why an OTLP endpoint cannot be sent to, naming the variable that set it; None when it can. HTTP needs an
    http(s) URL with a host; gRPC also takes the bare ``host:port`` its exporter accepts."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(endpoint)
        host, _ = parts.hostname, parts.port  # .port raises for a port that is not a number
    except ValueError:
        host, parts = None, None
    if parts is not None and parts.scheme in ("http", "https") and host:
        return None
    if protocol == GRPC and re.fullmatch(r"[A-Za-z0-9.\-]+:\d{1,5}", endpoint):
        return None
    example = "http://host:4317" if protocol == GRPC else "http://host:4318"
    return f"{variable} is not an endpoint URL; write it as {example} (https:// for TLS)"


def _milliseconds_as_seconds(name: str, milliseconds: str) -> float:
    try:
        value = float(milliseconds) / 1000
    except ValueError:
        raise ConfigurationError(f"{name} is not a number of milliseconds") from None
    if value <= 0:
        raise ConfigurationError(f"{name} must be a positive number of milliseconds")
    return value


@dataclass(frozen=True)
class LangfuseSettings:
    """A Langfuse project's OTLP endpoint and keys, from ``LANGFUSE_*`` (the variables Langfuse's own SDKs read)."""

    public_key: str = field(repr=False)
    secret_key: str = field(repr=False)
    base_url: str = LANGFUSE_DEFAULT_BASE_URL
    timeout_s: float = DEFAULT_TIMEOUT_S
    environment: str | None = None  # LANGFUSE_TRACING_ENVIRONMENT: where traces and scores are filed
    release: str | None = None  # LANGFUSE_RELEASE
    cache_home: Path | None = None  # XDG_CACHE_HOME: where the project id behind trace links is remembered

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LangfuseSettings | None:
        """None unless both keys are set. ``LANGFUSE_BASE_URL`` wins over the older ``LANGFUSE_HOST``;
        ``LANGFUSE_TIMEOUT`` is in seconds, as in the Langfuse SDK."""
        env = _Env(os.environ if environ is None else environ)
        public, secret = env.get("LANGFUSE_PUBLIC_KEY"), env.get("LANGFUSE_SECRET_KEY")
        base_variable, base = env.first("LANGFUSE_BASE_URL", "LANGFUSE_HOST") or ("", LANGFUSE_DEFAULT_BASE_URL)
        timeout = env.get("LANGFUSE_TIMEOUT")
        environment, release = env.get("LANGFUSE_TRACING_ENVIRONMENT"), env.get("LANGFUSE_RELEASE")
        cache_home = (env.get("XDG_CACHE_HOME") or "").strip()
        if not (public and secret):
            return None
        # Checked here, as an OTLP endpoint is: sent to as it is, it would fail every export and score with a
        # message about the request, not the setting.
        unusable = base_variable and http_url_problem(
            base_variable, base, "https://cloud.langfuse.com (https://us.cloud.langfuse.com, or your own host, "
            "e.g. http://localhost:3000)")
        if unusable:
            raise ConfigurationError(unusable)
        try:
            timeout_s = float(timeout) if timeout else DEFAULT_TIMEOUT_S
        except ValueError:
            raise ConfigurationError("LANGFUSE_TIMEOUT is not a number of seconds") from None
        return cls(public_key=public, secret_key=secret, base_url=base.rstrip("/"), timeout_s=timeout_s,
                   environment=environment, release=release, cache_home=Path(cache_home) if cache_home else None)

    @property
    def traces_url(self) -> str:
        return self.base_url + LANGFUSE_TRACES_PATH

    def authorization(self) -> str:
        """The Basic authorization header value of the project's key pair."""
        token = base64.b64encode(f"{self.public_key}:{self.secret_key}".encode()).decode("ascii")
        return f"Basic {token}"


@dataclass(frozen=True)
class BatchSettings:
    """The batch span processor's ``OTEL_BSP_*`` settings; None leaves the SDK's default."""

    schedule_delay_ms: int | None = None
    max_queue_size: int | None = None
    max_export_batch_size: int | None = None
    export_timeout_ms: int | None = None

    def arguments(self) -> dict[str, Any]:
        """Keyword arguments for BatchSpanProcessor: only what was set."""
        given = {"schedule_delay_millis": self.schedule_delay_ms, "max_queue_size": self.max_queue_size,
                 "max_export_batch_size": self.max_export_batch_size, "export_timeout_millis": self.export_timeout_ms}
        return {name: value for name, value in given.items() if value is not None}


def _deprecated_spill_file(env: _Env) -> str | None:
    """LOOPTRACE_SPILL_FILE, the undelivered list's old variable: still read (when the new one is unset), with a
    warning a user sees (FutureWarning: shown by default, unlike DeprecationWarning)."""
    value = env.get("LOOPTRACE_SPILL_FILE")
    if value:
        warnings.warn("LOOPTRACE_SPILL_FILE is deprecated: set LOOPTRACE_UNDELIVERED_FILE instead", FutureWarning,
                      stacklevel=2)
    return value


def parse_exporters(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """A comma list (or a list) of exporter names, validated, duplicates removed, order kept."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    names: list[str] = []
    for item in (i.strip().lower() for i in items):
        if not item:
            continue
        if item not in KNOWN_EXPORTERS:
            raise ConfigurationError(f"unknown exporter {item!r}; choose from {', '.join(KNOWN_EXPORTERS)}")
        if item not in names:
            names.append(item)
    return tuple(names)


def _absolute_path(value: str | None) -> Path | None:
    """A directory an XDG variable names; the base directory specification says to ignore a relative one."""
    return Path(value) if value and os.path.isabs(value) else None


def parse_mappings(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """A comma list (or a list) of backend mappings (``OTLP_MAPPINGS``; ``none`` for none), validated, order kept."""
    items = (value.split(",") if isinstance(value, str) else list(value)) if value is not None else []
    names: list[str] = []
    for item in (i.strip().lower() for i in items):
        if not item or item == "none":
            continue
        if item not in OTLP_MAPPINGS:
            raise ConfigurationError(f"LOOPTRACE_OTLP_MAPPINGS: unknown mapping {item!r}; choose from "
                                     f"{', '.join(OTLP_MAPPINGS)} (or none)")
        if item not in names:
            names.append(item)
    return tuple(names)


@dataclass(frozen=True)
class Settings:
    """looptrace's whole configuration. ``Settings.from_env()`` reads it; ``Settings()`` is the defaults alone.

    ``exporters`` is an explicit choice (``LOOPTRACE_EXPORTER``, else ``OTEL_TRACES_EXPORTER``) or None, in which
    case ``chosen_exporters()`` picks the trace file and the configured backends beside it.
    """

    exporters: tuple[str, ...] | None = None
    trace_file: Path = DEFAULT_TRACE_FILE
    undelivered_file: Path = DEFAULT_UNDELIVERED_FILE  # tracefile/undelivered.py: span ids, not a copy of spans
    trace_file_max_bytes: int = DEFAULT_TRACE_FILE_MAX_BYTES  # 0: the trace file never rotates
    trace_file_backups: int = DEFAULT_TRACE_FILE_BACKUPS
    prometheus_port: int | None = None
    model: str = DEFAULT_MODEL
    judge: str | None = None  # the detector's judge model: confirms ignored_error before it is reported
    judge_max_calls: int | None = None  # judge calls per run at most; None: the detector's default
    capture_content: bool = True  # content attributes on spans (capture_setting's mode is SPAN_ONLY or SPAN_AND_EVENT)
    capture_setting: str | None = None  # the capture variable's value as set (None: unset, capture on spans)
    max_attribute_chars: int = DEFAULT_MAX_ATTRIBUTE_CHARS
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES  # reading the trace file and undelivered list: longer lines skipped
    state_home: Path | None = None  # XDG_STATE_HOME: resumed runs are claimed under it (runtime/resume_claims.py)
    alert_webhook: str | None = field(default=None, repr=False)  # the URL is the credential
    telemetry_disabled: bool = False
    otlp_metrics_disabled: bool = False
    service_name: str | None = None
    resource_attributes: Mapping[str, str] = field(default_factory=dict)
    langfuse: LangfuseSettings | None = None
    otlp: OtlpSettings = field(default_factory=OtlpSettings)
    # The backends' mappings the OTLP exporter adds to each span (LOOPTRACE_OTLP_MAPPINGS): none by default, the
    # conventions alone; langfuse and/or openinference when the collector forwards to Langfuse or Phoenix.
    otlp_mappings: tuple[str, ...] = ()
    otlp_metrics: OtlpSettings = field(default_factory=lambda: OtlpSettings(signal="metrics",
                                                                            endpoint="http://localhost:4318/v1/metrics"))
    batch: BatchSettings = field(default_factory=BatchSettings)
    traceparent: str | None = None
    tracestate: str | None = None
    watch_token: str | None = field(default=None, repr=False)  # what `looptrace watch` requires of senders
    watch_basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    exporters_variable: str | None = None  # the variable ``exporters`` came from (LOOPTRACE_EXPORTER, ...), if any
    # Values that were set but cannot be used and are ignored, each a sentence naming its variable; configure() says
    # each once, as a warning (a variable may be meant for another program, so these are no errors).
    ignored: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Everything from the environment (``os.environ`` unless given). Raises ConfigurationError for a value that
        is wrong wherever it is used (an unknown exporter name, a port that is not a port)."""
        source = os.environ if environ is None else environ
        env = _Env(source)
        ignored: list[str] = []
        exporters, exporters_variable = _explicit_exporters(env, ignored)
        _langfuse_half_set(env, ignored)
        return cls(
            exporters=exporters,
            exporters_variable=exporters_variable,
            trace_file=Path(env.get("LOOPTRACE_TRACE_FILE") or DEFAULT_TRACE_FILE),
            undelivered_file=Path(env.get("LOOPTRACE_UNDELIVERED_FILE") or _deprecated_spill_file(env)
                                  or DEFAULT_UNDELIVERED_FILE),
            trace_file_max_bytes=_size(env, "LOOPTRACE_TRACE_FILE_MAX_BYTES", ignored, DEFAULT_TRACE_FILE_MAX_BYTES),
            trace_file_backups=_count(env, "LOOPTRACE_TRACE_FILE_BACKUPS", ignored, DEFAULT_TRACE_FILE_BACKUPS),
            prometheus_port=_port(env.get("LOOPTRACE_PROMETHEUS_PORT")),
            model=env.get("LOOPTRACE_MODEL") or DEFAULT_MODEL,
            judge=env.get("LOOPTRACE_JUDGE"),
            judge_max_calls=_whole(env, "LOOPTRACE_JUDGE_MAX_CALLS", ignored),
            capture_content=capture_mode_name(_capture(env, ignored)) in (None, "SPAN_ONLY", "SPAN_AND_EVENT"),
            capture_setting=_capture(env, []),
            max_attribute_chars=_whole(env, "LOOPTRACE_MAX_ATTRIBUTE_CHARS", ignored,
                                       default=DEFAULT_MAX_ATTRIBUTE_CHARS) or DEFAULT_MAX_ATTRIBUTE_CHARS,
            max_line_bytes=_max_line_bytes(env.get(MAX_LINE_BYTES_VARIABLE), ignored),
            state_home=_absolute_path(env.get("XDG_STATE_HOME")),
            alert_webhook=env.get("LOOPTRACE_ALERT_WEBHOOK"),
            telemetry_disabled=(env.get("OTEL_SDK_DISABLED") or "").lower() == "true",
            otlp_metrics_disabled=(env.get("OTEL_METRICS_EXPORTER") or "").lower() == "none",
            service_name=env.get("OTEL_SERVICE_NAME"),
            resource_attributes=_resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES")),
            langfuse=LangfuseSettings.from_env(source),
            otlp=OtlpSettings.from_env("traces", source),
            otlp_mappings=parse_mappings(env.get("LOOPTRACE_OTLP_MAPPINGS")),
            otlp_metrics=OtlpSettings.from_env("metrics", source),
            batch=BatchSettings(
                # A value the SDK could not read is replaced by its default here, so that the SDK never reads the
                # variable itself (it would print a traceback, or refuse a 0 and fail the whole set-up).
                schedule_delay_ms=_whole(env, "OTEL_BSP_SCHEDULE_DELAY", ignored, default=5_000),
                max_queue_size=_whole(env, "OTEL_BSP_MAX_QUEUE_SIZE", ignored),
                max_export_batch_size=_whole(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", ignored, default=512),
                export_timeout_ms=_whole(env, "OTEL_BSP_EXPORT_TIMEOUT", ignored, default=30_000),
            ),
            traceparent=env.get("TRACEPARENT"),
            tracestate=env.get("TRACESTATE"),
            watch_token=env.get("LOOPTRACE_WATCH_TOKEN"),
            watch_basic_auth=_watch_basic_auth(env),
            ignored=tuple(ignored),
        )

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with the given fields replaced; None means "keep this one" (how unset flags read)."""
        given = {name: value for name, value in changes.items() if value is not None}
        if "exporters" in given:
            given["exporters"] = parse_exporters(given["exporters"]) or None
        if "otlp_mappings" in given:
            given["otlp_mappings"] = parse_mappings(given["otlp_mappings"])
        for name in ("trace_file", "undelivered_file"):
            if name in given:
                given[name] = Path(given[name])
        return dataclasses.replace(self, **given)

    def configured_backends(self) -> list[str]:
        """The network backends the settings set up: ``langfuse`` when both keys are set, ``otlp`` when an OTLP
        traces endpoint is."""
        names = []
        if self.langfuse is not None:
            names.append("langfuse")
        if self.otlp.endpoint_configured:
            names.append("otlp")
        return names

    def chosen_exporters(self) -> list[str]:
        """The exporters a run uses: the explicit choice, taken exactly, else the trace file and beside it the
        configured backends (so every run can be read locally with ``looptrace traces show``). Empty when telemetry
        is disabled or ``none`` was chosen."""
        if self.telemetry_disabled:
            return []
        if self.exporters:
            return [name for name in self.exporters if name != "none"]
        return ["file", *self.configured_backends()]


def _explicit_exporters(env: _Env, ignored: list[str]) -> tuple[tuple[str, ...] | None, str | None]:
    """The exporters a variable chooses, and which variable."""
    names = parse_exporters(env.get("LOOPTRACE_EXPORTER"))
    if names:
        return names, "LOOPTRACE_EXPORTER"
    value = env.get("OTEL_TRACES_EXPORTER")
    if not value:
        return None, None
    # Only the names that mean the same here; anything else (zipkin, ...) is for other distributions to interpret,
    # so it is ignored, and said: a user who meant it for looptrace must not believe it took effect.
    if all(v.strip().lower() in _OTEL_TRACES_EXPORTERS for v in value.split(",")):
        return parse_exporters(value), "OTEL_TRACES_EXPORTER"
    ignored.append("OTEL_TRACES_EXPORTER names an exporter looptrace does not export to"
                   f" (it reads {', '.join(_OTEL_TRACES_EXPORTERS)} there; LOOPTRACE_EXPORTER takes "
                   f"{', '.join(KNOWN_EXPORTERS)}); the variable is ignored")
    return None, None


_OTEL_TRACES_EXPORTERS = ("otlp", "console", "none")


def _capture(env: _Env, ignored: list[str]) -> str | None:
    """The capture setting as given: LOOPTRACE_CAPTURE_CONTENT wins over the GenAI conventions' variable. A value
    that is no mode is NO_CONTENT (a typo must not start recording), said once in ``ignored`` by its variable."""
    found = env.first("LOOPTRACE_CAPTURE_CONTENT", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
    if found is None:
        return None
    variable, value = found
    if value.strip() and not capture_mode_known(value):
        ignored.append(f"{variable} is not a capture mode (it takes {', '.join(CAPTURE_MODES)}, true or false); "
                       "NO_CONTENT is assumed")
        return "NO_CONTENT"
    return value


def capture_mode_name(value: str | None) -> str | None:
    """A capture setting as one of CAPTURE_MODES, or None when unset (content.capture_mode adds the warning for an
    unknown value). The modes are the GenAI utilities' (any case); true/false are the older instrumentations'
    spellings of SPAN_ONLY/NO_CONTENT; anything else is NO_CONTENT, as the utilities treat an unknown value."""
    text = (value or "").strip()
    if not text:
        return None
    if text.upper() in CAPTURE_MODES:
        return text.upper()
    if text.lower() in _CAPTURE_TRUE:
        return "SPAN_ONLY"
    return "NO_CONTENT"


def capture_mode_known(value: str) -> bool:
    text = value.strip()
    return text.upper() in CAPTURE_MODES or text.lower() in _CAPTURE_TRUE | _CAPTURE_FALSE


def _langfuse_half_set(env: _Env, ignored: list[str]) -> None:
    """One Langfuse key without the other leaves Langfuse off: said, so that nobody waits for traces that never
    come."""
    public, secret = env.get("LANGFUSE_PUBLIC_KEY"), env.get("LANGFUSE_SECRET_KEY")
    if bool(public) != bool(secret):
        given, missing = (("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY") if public
                          else ("LANGFUSE_SECRET_KEY", "LANGFUSE_PUBLIC_KEY"))
        ignored.append(f"{given} is set without {missing}; Langfuse needs both keys and is left off")


def _watch_basic_auth(env: _Env) -> tuple[str, str] | None:
    username, password = env.get("LOOPTRACE_WATCH_USERNAME"), env.get("LOOPTRACE_WATCH_PASSWORD")
    if (username is None) != (password is None):
        raise ConfigurationError("set both LOOPTRACE_WATCH_USERNAME and LOOPTRACE_WATCH_PASSWORD, or neither")
    return (username, password) if username is not None and password is not None else None


def _whole(env: _Env, name: str, ignored: list[str], default: int | None = None) -> int | None:
    """A positive whole number from ``name``; unset is None; anything else is ignored, said, and ``default``."""
    value = env.get(name)
    if value is None:
        return None
    if value.isdigit() and int(value) > 0:
        return int(value)
    instead = f"the default ({default:,})" if default is not None else "the default"
    ignored.append(f"{name} is not a positive whole number; {instead} is used")
    return default


def _count(env: _Env, name: str, ignored: list[str], default: int) -> int:
    """A whole number, 0 included, from ``name``; unset is ``default``, and so is anything else, said."""
    value = env.get(name)
    if value is None or not value.strip():
        return default
    if value.strip().isdigit():
        return int(value)
    problem = "is negative" if re.fullmatch(r"-\s*\d+", value.strip()) else "is not a whole number"
    ignored.append(f"{name} {problem}; the default ({default:,}) is used")
    return default


# Sizes in bytes: a number, or a number and a unit; KB, MB and GB count in thousands, KiB, MiB and GiB in 1,024s.
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
SIZE_HINT = "write bytes, or a number with KiB, MiB or GiB (or KB, MB, GB), e.g. 64MiB"


def parse_size(text: str) -> int:
    """Bytes from ``"1048576"``, ``"64MiB"``, ``"1.5 GB"``; ValueError naming what is wrong (never the text)."""
    match = re.fullmatch(r"(-?)\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)", text.strip())
    if match is None or match.group(3).lower() not in _SIZE_UNITS:
        raise ValueError(f"is not a size ({SIZE_HINT})")
    if match.group(1):
        raise ValueError("is negative")
    return int(float(match.group(2)) * _SIZE_UNITS[match.group(3).lower()])


def _size(env: _Env, name: str, ignored: list[str], default: int) -> int:
    """A size in bytes, 0 included, from ``name`` (``parse_size``); unset is ``default``, and so is anything else,
    said."""
    value = env.get(name)
    if value is None:
        return default
    try:
        return parse_size(value)
    except ValueError as problem:
        ignored.append(f"{name} {problem}; the default ({default:,} bytes) is used")
        return default


def _max_line_bytes(value: str | None, ignored: list[str]) -> int:
    """A size in bytes (``parse_size``), raised to the 1 KiB floor, said; unset is the default, and so is anything
    that is not a size, said (``ignored``)."""
    if not value:
        return DEFAULT_MAX_LINE_BYTES
    try:
        size = parse_size(value)
    except ValueError as problem:
        ignored.append(f"{MAX_LINE_BYTES_VARIABLE} {problem}; the default ({DEFAULT_MAX_LINE_BYTES:,} bytes) is used")
        return DEFAULT_MAX_LINE_BYTES
    if size < MIN_MAX_LINE_BYTES:
        ignored.append(f"{MAX_LINE_BYTES_VARIABLE} is below its floor; {MIN_MAX_LINE_BYTES:,} bytes is used")
        return MIN_MAX_LINE_BYTES
    return size


def _port(value: str | None) -> int | None:
    if value is None:
        return None
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ConfigurationError("LOOPTRACE_PROMETHEUS_PORT is not a port number (1 to 65535)")
    return int(value)


def _resource_attributes(value: str | None) -> dict[str, str]:
    """``key=value,key=value`` with URL-encoded values, as the specification writes OTEL_RESOURCE_ATTRIBUTES."""
    attributes: dict[str, str] = {}
    for entry in (value or "").split(","):
        name, equals, content = entry.partition("=")
        if equals and name.strip():
            attributes[unquote(name.strip())] = unquote(content.strip())
    return attributes
