"""Exporter factories: the OpenTelemetry project's OTLP exporters, built from ``Settings`` for a collector or Langfuse.

``network_exporter("langfuse" | "otlp")`` is what ``configure()`` and ``push`` use: the exporter, wrapped in
``delivery.GuardedExporter``. ``OTEL_EXPORTER_OTLP_TIMEOUT`` is read in **milliseconds**, as the OpenTelemetry
specification defines it and as every other language's SDK reads it; the Python exporters read it as seconds when left
to themselves, so looptrace always passes the timeout explicitly and the two readings never mix.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import requests
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ..settings import GRPC, ConfigurationError, LangfuseSettings, OtlpSettings, Settings
from ..tracefile.encodable import encodable_spans
from .delivery import GuardedExporter, GuardedMetricExporter, UndeliveredSink
from .failures import OutcomeProbe

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricExporter
    from opentelemetry.sdk.metrics.view import Aggregation

# Langfuse v4 processes spans in real time only when the exporter says it speaks ingestion version 4.
LANGFUSE_INGESTION_VERSION = "4"


def otlp_span_exporter(settings: OtlpSettings, *, probe: OutcomeProbe | None = None) -> SpanExporter:
    """The OpenTelemetry OTLP span exporter (HTTP/protobuf or gRPC, as the settings choose) for a collector."""
    settings.check()
    _quiet_sdk_header_warnings()
    if settings.protocol == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

        return RepairingSpanExporter(GrpcSpanExporter(**_grpc_arguments(settings)))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return RepairingSpanExporter(OTLPSpanExporter(**_http_arguments(settings, probe)))


def otlp_metric_exporter(settings: OtlpSettings, *, probe: OutcomeProbe | None = None) -> MetricExporter:
    """The OpenTelemetry OTLP metric exporter (``OTEL_EXPORTER_OTLP_METRICS_*`` variants first)."""
    settings.check()
    _quiet_sdk_header_warnings()
    temporality, aggregation = metric_preferences(settings)
    if settings.protocol == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter

        return GrpcMetricExporter(**_grpc_arguments(settings), preferred_temporality=temporality,
                                  preferred_aggregation=aggregation)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter(**_http_arguments(settings, probe), preferred_temporality=temporality,
                              preferred_aggregation=aggregation)


def metric_preferences(settings: OtlpSettings) -> tuple[dict[type, AggregationTemporality], dict[type, Aggregation]]:
    """The temporality and histogram aggregation the OTLP metric variables ask for, per instrument class, as the
    specification defines them: what the exporter is built with, and what its guard tells the metric reader."""
    from opentelemetry.sdk.metrics import (
        Counter,
        Histogram,
        ObservableCounter,
        ObservableGauge,
        ObservableUpDownCounter,
        UpDownCounter,
    )
    from opentelemetry.sdk.metrics.export import AggregationTemporality
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, ExponentialBucketHistogramAggregation

    delta, cumulative = AggregationTemporality.DELTA, AggregationTemporality.CUMULATIVE
    deltas = {"delta": (Counter, Histogram, ObservableCounter), "lowmemory": (Counter, Histogram)}.get(
        settings.temporality, ())
    temporality: dict[type, AggregationTemporality] = {kind: delta if kind in deltas else cumulative for kind in
                   (Counter, UpDownCounter, Histogram, ObservableCounter, ObservableUpDownCounter, ObservableGauge)}
    histogram: Aggregation = (ExponentialBucketHistogramAggregation() if settings.histogram_aggregation ==
                              "base2_exponential_bucket_histogram" else ExplicitBucketHistogramAggregation())
    return temporality, {Histogram: histogram}


def langfuse_span_exporter(settings: LangfuseSettings, *, probe: OutcomeProbe | None = None) -> SpanExporter:
    """A plain OTLP/HTTP exporter to ``{base}/api/public/otel/v1/traces``: Basic auth with the project's keys and
    ``x-langfuse-ingestion-version: 4``, gzip. Langfuse has no gRPC endpoint, so there is no protocol choice."""
    _quiet_sdk_header_warnings()
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    headers = {"authorization": settings.authorization(), "x-langfuse-ingestion-version": LANGFUSE_INGESTION_VERSION}
    # The HTTP exporter always merges OTEL_EXPORTER_OTLP_[TRACES_]HEADERS into its headers, and its TLS settings come
    # from OTEL_EXPORTER_OTLP_*_CERTIFICATE: both are meant for the collector. The session sends exactly our headers,
    # so a collector's token never travels to Langfuse, and it verifies TLS the ordinary way.
    session = ProbingSession(probe, only_headers=headers)
    exporter = OTLPSpanExporter(endpoint=settings.traces_url, headers=headers, timeout=settings.timeout_s,
                                compression=Compression.Gzip, session=session)
    session.verify, session.cert = True, None
    return RepairingSpanExporter(exporter)


class RepairingSpanExporter(SpanExporter):
    """An SDK span exporter, handed spans its encoder can take whole (``encodable``: a lone surrogate or an integer
    beyond 64 bits would cost the attribute, or the batch). Encoding, sending and retries stay the SDK exporter's."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.exporter.export(encodable_spans(spans))

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.exporter.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.exporter.shutdown()


def _http_arguments(settings: OtlpSettings, probe: OutcomeProbe | None) -> dict[str, Any]:
    from opentelemetry.exporter.otlp.proto.http import Compression

    return {
        "endpoint": settings.endpoint,
        "headers": dict(settings.headers),
        "timeout": settings.timeout_s,
        "compression": Compression(settings.compression),
        "session": ProbingSession(probe),
    }


def _grpc_arguments(settings: OtlpSettings) -> dict[str, Any]:
    import grpc

    compression = {"none": grpc.Compression.NoCompression, "gzip": grpc.Compression.Gzip,
                   "deflate": grpc.Compression.Deflate}[settings.compression]
    return {
        "endpoint": settings.endpoint,
        "insecure": settings.insecure,
        "headers": dict(settings.headers),
        "timeout": settings.timeout_s,
        "compression": compression,
    }


def network_exporter(name: str, settings: Settings, *, undelivered: UndeliveredSink | None = None) -> GuardedExporter:
    """The guarded span exporter for ``"langfuse"`` or ``"otlp"``."""
    probe = OutcomeProbe()
    if name == "langfuse":
        langfuse = settings.langfuse
        if langfuse is None:
            raise ConfigurationError("the langfuse exporter needs LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY "
                                     "(and LANGFUSE_BASE_URL for a self-hosted Langfuse)")
        inner = langfuse_span_exporter(langfuse, probe=probe)
        return GuardedExporter(name, inner, endpoint=langfuse.traces_url, probe=probe, timeout_s=langfuse.timeout_s,
                               undelivered=undelivered)
    if name == "otlp":
        otlp = settings.otlp
        return GuardedExporter(name, otlp_span_exporter(otlp, probe=probe), endpoint=otlp.endpoint, probe=probe,
                               timeout_s=otlp.timeout_s, undelivered=undelivered)
    raise ConfigurationError(f"{name!r} is not a network exporter; choose langfuse or otlp")


def network_metric_exporter(settings: Settings) -> GuardedMetricExporter:
    """The guarded OTLP metric exporter."""
    otlp = settings.otlp_metrics
    probe = OutcomeProbe()
    temporality, aggregation = metric_preferences(otlp)
    return GuardedMetricExporter("otlp", otlp_metric_exporter(otlp, probe=probe), endpoint=otlp.endpoint,
                                 probe=probe, timeout_s=otlp.timeout_s, preferred_temporality=temporality,
                                 preferred_aggregation=aggregation)


class ProbingSession(requests.Session):
    """The requests session of an OTLP/HTTP exporter: tells the probe how each request ended.

    ``only_headers``, when given, replaces the exporter's own header set (content headers aside).

    What the environment says about a URL (proxies, ``NO_PROXY``, ``REQUESTS_CA_BUNDLE``) is read on the first request
    to it and kept for the session's life, the exporter's: requests would otherwise scan the whole environment on
    every export, a measurable share of each export's CPU (issue 23), for settings a process does not change while
    it runs, just as the exporter reads its ``OTEL_EXPORTER_OTLP_*`` variables once.
    """

    _CONTENT_HEADERS = ("content-type", "content-encoding", "user-agent")

    def __init__(self, probe: OutcomeProbe | None, only_headers: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self._probe = probe
        self._only_headers = dict(only_headers) if only_headers is not None else None
        self._environment: dict[tuple[Any, ...], dict[str, Any]] = {}

    def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any,
                                   cert: Any) -> dict[str, Any]:
        # The key holds everything the merge reads besides the environment, the session's own settings included.
        key = (url, tuple(sorted((proxies or {}).items())), stream, verify, cert,
               tuple(sorted(self.proxies.items())), self.stream, self.verify, self.cert, self.trust_env)
        merged = self._environment.get(key)
        if merged is None:
            merged = self._environment[key] = super().merge_environment_settings(url, proxies, stream, verify, cert)
        return {**merged, "proxies": dict(merged["proxies"])}

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        if self._only_headers is not None:
            given = kwargs.get("headers") or {}
            kept = {k: v for k, v in given.items() if k.lower() in self._CONTENT_HEADERS}
            kwargs["headers"] = {**kept, **self._only_headers}
        try:
            response = super().request(method, url, *args, **kwargs)
        except Exception as error:
            if self._probe is not None:
                self._probe.record_exception(error)
            raise
        if self._probe is not None:
            self._probe.record_status(response.status_code)
        return response


class _SdkHeaderWarnings(logging.Filter):
    """Drops the SDK's "Header format invalid" warnings: every OTLP exporter it builds parses
    OTEL_EXPORTER_OTLP_HEADERS again and prints the malformed value, which is usually a token. Settings reports the
    problem once, naming the variable and never its value."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "header format invalid" not in str(record.msg).lower()


_header_filter_lock = threading.Lock()
_header_filter_installed = False


def _quiet_sdk_header_warnings() -> None:
    global _header_filter_installed
    with _header_filter_lock:
        if not _header_filter_installed:
            logging.getLogger("opentelemetry.util.re").addFilter(_SdkHeaderWarnings())
            _header_filter_installed = True
