"""Where an anomaly goes besides the spans and the metric: a log line, a webhook, your own callback, a Langfuse score.

``AnomalySinks`` is the whole fan-out (``recording.sinks.AnomalySink`` is what the spans call).
``anomaly_sinks(settings)`` builds it from the settings where telemetry is built (``configure()``, an ``Agent`` built
without telemetry), so an anomaly reaches the same places whoever set things up. The run is handed its sinks by
the telemetry it records through; nothing looks them up. Every sink is on by default where it costs nothing (the
structlog WARNING); the webhook is on when a URL is given (``LOOPTRACE_ALERT_WEBHOOK``); the score when the settings
send spans to Langfuse. A webhook posts at most once per run and anomaly type, from a background thread, with a
timeout: an alert channel that is slow or down never holds up the agent. A streak that an earlier run of the same
session already alerted (``Anomaly.continued``) is not announced again by any sink, unless it now stops the run:
``AnomalySinks.send`` checks that once (``announces``) for all of them. Webhook URLs are credentials (a Slack
incoming-webhook URL is enough to post to the channel), so only their host is ever logged.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .detector import Anomaly, LoopCost, format_usd
from .logs import log
from .recording.sinks import AlertContext
from .settings import ConfigurationError

if TYPE_CHECKING:
    from .langfuse.scores import LangfuseScores
    from .settings import Settings

_MAX_REMEMBERED_POSTS = 10_000


AlertCallback = Callable[[Anomaly, AlertContext], None]


def announces(anomaly: Anomaly, context: AlertContext) -> bool:
    """Whether a report is news for the alert sinks. A streak carried over from an earlier run of the session
    (``continued``) was announced there: this run's spans and result record it, the sinks stay quiet, unless the
    detector's finding now stops the run (a stop is news)."""
    return not anomaly.continued or context.action == "stop"


class Alerts:
    """The alert sinks of an agent. One instance may serve many runs at once."""

    def __init__(
        self,
        *,
        webhook_url: str | None = None,
        webhook_timeout_s: float = 5.0,
        callback: AlertCallback | None = None,
        log_warnings: bool = True,
    ) -> None:
        self.webhook_url = webhook_url or None
        if self.webhook_url and urlsplit(self.webhook_url).scheme not in ("http", "https"):
            # Said without the URL: the URL is the credential.
            raise ConfigurationError("the alert webhook URL (LOOPTRACE_ALERT_WEBHOOK) must start with http:// or "
                                     "https://")
        self.webhook_timeout_s = webhook_timeout_s
        self.callback = callback
        self.log_warnings = log_warnings
        # (trace_id, anomaly type) already posted: one post each. Bounded, for services that run for months.
        self._posted: OrderedDict[tuple[str, ...], None] = OrderedDict()
        # (run, anomaly type, streak) already logged: one log line per streak.
        self._logged: OrderedDict[tuple[str, ...], None] = OrderedDict()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    @classmethod
    def from_settings(cls, settings: Settings, **options: Any) -> Alerts:
        """The log line, and the webhook when the settings name one (``LOOPTRACE_ALERT_WEBHOOK``)."""
        return cls(webhook_url=settings.alert_webhook or None, **options)

    def send(self, anomaly: Anomaly, context: AlertContext) -> None:
        """Every alert of one report (the sinks it is part of decided it is news: ``AnomalySinks.send``)."""
        # Each streak is logged once: a streak nudged and then stopped is still one anomaly (the callback hears
        # the stop too, and the webhook posts once per run and type anyway). Once per streak as this instance saw it,
        # not "its first firing": `looptrace watch` often first sees a loop already past it (a run's spans arrive in
        # one request), and must still say it.
        if self.log_warnings and self._first_report(context.conversation or context.trace_id, anomaly):
            log.warning(
                "loop_anomaly",
                anomaly_type=anomaly.type,
                tool=anomaly.tool,
                count=anomaly.count,
                turn=anomaly.turn,
                action=context.action,
                agent=context.agent,
                trace_id=context.trace_id,
                span_id=context.span_id,
                message=anomaly.message,
                **_conversation_fields(context),
                **cost_fields(anomaly.cost),
            )
        if self.callback is not None:
            try:
                self.callback(anomaly, context)
            except Exception as exc:  # the user's hook failing must not fail the user's agent
                log.warning("alert_callback_failed", error=f"{type(exc).__name__}: {exc}")
        if self.webhook_url and self._first_of_its_kind(context.conversation or context.trace_id, anomaly.type):
            thread = threading.Thread(target=self._post, args=(webhook_payload(anomaly, context),),
                                      name="looptrace-alert-webhook", daemon=True)
            thread.start()
            with self._lock:
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait for webhook posts in flight, ``timeout_s`` at most for all of them (the CLI does before it exits;
        tests do to observe them)."""
        with self._lock:
            threads = list(self._threads)
        until = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in threads:
            thread.join(None if until is None else max(until - time.monotonic(), 0.0))

    def _first_report(self, run: str, anomaly: Anomaly) -> bool:
        """Whether this instance has not logged the streak of ``anomaly`` in ``run`` yet."""
        return self._remember(self._logged, (run, anomaly.type, anomaly.streak))

    def _first_of_its_kind(self, trace_id: str, anomaly_type: str) -> bool:
        return self._remember(self._posted, (trace_id, anomaly_type))

    def _remember(self, seen: OrderedDict[tuple[str, ...], None], key: tuple[str, ...]) -> bool:
        """True the first time ``key`` is seen. Bounded, for services that run for months."""
        with self._lock:
            if key in seen:
                return False
            seen[key] = None
            if len(seen) > _MAX_REMEMBERED_POSTS:
                seen.popitem(last=False)
            return True

    def _post(self, payload: dict[str, Any]) -> None:
        assert self.webhook_url is not None  # posts are only started when there is a URL
        # Imported here: urllib.request brings http.client and email with it, which the reading commands (detect,
        # show) would otherwise load at start-up through the interface without ever posting.
        import urllib.error
        import urllib.request

        request = urllib.request.Request(
            self.webhook_url, data=json.dumps(payload).encode(), method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "looptrace-alerts"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.webhook_timeout_s) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            self._warn(f"HTTP {exc.code}")
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            self._warn(f"{type(reason).__name__}: {reason}")
        except Exception as exc:  # whatever else urllib raises, its message may quote the URL: name the type only
            self._warn(type(exc).__name__)

    def _warn(self, cause: str) -> None:
        log.warning("alert_webhook_failed", host=urlsplit(self.webhook_url).hostname, cause=cause)


@dataclass(frozen=True, slots=True)
class AnomalySinks:
    """Every place an anomaly report goes besides the trace: the alerts (log line, webhook, callback) and, when the
    spans go to Langfuse, the ``loop_anomaly`` score on the run's trace. One report, one call of ``send``."""

    alerts: Alerts
    scores: LangfuseScores | None = None

    @classmethod
    def from_settings(cls, settings: Settings, *, scores: LangfuseScores | None = None) -> AnomalySinks:
        """The alerts ``settings`` describe and the ``scores`` given: a fresh fan-out (``anomaly_sinks`` shares one)."""
        return cls(alerts=Alerts.from_settings(settings), scores=scores)

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait for webhook posts in flight."""
        self.alerts.wait(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Send the scores still queued, within ``timeout_s``, and stop their worker (a service on its way out)."""
        if self.scores is not None:
            self.scores.close(timeout_s)

    def with_alerts(self, alerts: Alerts | None) -> AnomalySinks:
        """The same sinks with the alerts an Agent was given (``Agent(alerts=...)``) in place of these."""
        return self if alerts is None or alerts is self.alerts else replace(self, alerts=alerts)

    def run_ended(self, trace_id: str, span_id: str, loop_cost_by_type: Mapping[str, LoopCost]) -> None:
        """A run ended: its ``looped`` and ``loop_cost_usd`` scores, when scores go to Langfuse."""
        if self.scores is not None and _is_trace_id(trace_id):
            try:
                self.scores.run_ended(trace_id, loop_cost_by_type, span_id=span_id)
            except Exception as exc:  # a score that cannot even be queued must not fail the run it describes
                log.warning("langfuse_score_failed", error=type(exc).__name__)

    def send(self, anomaly: Anomaly, context: AlertContext) -> None:
        if not announces(anomaly, context):
            return  # an earlier run of the session announced this streak: no second log line, post or score
        self.alerts.send(anomaly, context)
        # A score goes on a trace: for a run watch assembled from several traces (a session, a conversation), on
        # the latest, where the anomaly was seen (docs/alerts.md).
        if self.scores is not None and _is_trace_id(context.trace_id):
            try:
                self.scores.anomaly(context.trace_id, anomaly.type, anomaly.message, span_id=context.span_id,
                                    cost=anomaly.cost)
            except Exception as exc:  # a score that cannot even be queued must not fail the run it describes
                log.warning("langfuse_score_failed", error=type(exc).__name__)


def _is_trace_id(value: str) -> bool:
    return len(value) == 32 and value != _ZERO_TRACE_ID and all(c in "0123456789abcdef" for c in value)


_ZERO_TRACE_ID = "0" * 32


def webhook_payload(anomaly: Anomaly, context: AlertContext) -> dict[str, Any]:
    """A JSON body that Slack (and anything reading a ``text`` field) shows as is, with the details beside it."""
    tool = f" in `{anomaly.tool}`" if anomaly.tool else ""
    where = f"trace {context.trace_id}"
    if context.conversation:
        where += f" ({plural_traces(len(context.trace_ids))} of {context.conversation})"
    cost = f", {so_far(anomaly.cost)}" if anomaly.cost is not None else ""
    text = (f":warning: looptrace: {anomaly.type}{tool} (agent `{context.agent}`, turn {anomaly.turn}, "
            f"action {context.action}{cost}): {anomaly.message} — {where}")
    return {
        "text": text,
        "anomaly": anomaly.to_dict(),
        "agent": context.agent,
        "trace_id": context.trace_id,
        "span_id": context.span_id,
        "action": context.action,
        **_conversation_fields(context),
    }


def plural_traces(count: int) -> str:
    return "the latest of 1 trace" if count == 1 else f"the latest of {count} traces"


def _conversation_fields(context: AlertContext) -> dict[str, Any]:
    """The conversation (or session) a run of several traces was assembled from, and its traces, when it was."""
    if not context.conversation:
        return {}
    return {"conversation": context.conversation, "trace_ids": list(context.trace_ids)}


def so_far(cost: LoopCost) -> str:
    """"looping for 4 turns, 18,400 tokens, $0.3800 so far" (without a price: the tokens, and why no USD)."""
    turns = f"{cost.turns} turn{'s' if cost.turns != 1 else ''}"
    money = (f"{format_usd(cost.usd)} so far" if cost.usd is not None
             else f"so far (USD unknown: {cost.unpriced or 'no price'})")
    return f"looping for {turns}, {cost.total_tokens:,} tokens, {money}"


def cost_fields(cost: LoopCost | None) -> dict[str, Any]:
    """The log line's cost fields: tokens, turns, seconds and USD (or why there is none)."""
    if cost is None:
        return {}
    fields: dict[str, Any] = {"loop_turns": cost.turns, "loop_input_tokens": cost.input_tokens,
                              "loop_output_tokens": cost.output_tokens, "loop_total_tokens": cost.total_tokens}
    if cost.seconds is not None:
        fields["loop_seconds"] = round(cost.seconds, 3)
    if cost.usd is not None:
        fields["loop_cost_usd"] = cost.usd
    else:
        fields["loop_cost_unpriced"] = cost.unpriced
    return fields


def anomaly_sinks(settings: Settings, *, resource_attributes: Mapping[str, Any] | None = None) -> AnomalySinks:
    """The anomaly sinks ``settings`` describe: the log line, the webhook when one is named, and the Langfuse score
    when the settings send spans to Langfuse (filed in the environment ``resource_attributes`` name, by default the
    settings' own). Built once where telemetry is (``configure()``, an Agent's telemetry) and handed to every run
    recorded through it; whoever built them closes them (``AnomalySinks.close``: the scores still queued)."""
    langfuse = settings.langfuse if "langfuse" in settings.chosen_exporters() else None
    resource = settings.resource_attributes if resource_attributes is None else resource_attributes
    scores = None
    if langfuse is not None:
        from .langfuse.scores import LangfuseScores
        from .tracefile.undelivered import UndeliveredList

        scores = LangfuseScores.from_settings(langfuse, resource=resource)
        # A score Langfuse cannot take now is kept for `looptrace traces push`.
        scores.keep_undelivered = UndeliveredList(settings.undelivered_file).keep_score
    return AnomalySinks.from_settings(settings, scores=scores)
