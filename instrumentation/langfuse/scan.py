"""Which of the runs Langfuse holds looped: `looptrace detect` over a Langfuse project instead of a trace file.

``scan(client, query)`` lists the traces the query selects (a time window, a session, a user, tags, environments),
reads each one's observations, turns them back into spans (``observations``) and rebuilds and judges the
runs with the same ``RunRebuilder`` that `looptrace detect` and `looptrace watch` use, so a run gets the verdict
`detect` would give its spans in a file. Verdicts come out one trace at a time, oldest first (runs of one session
share the detector's memory, in the order they ran).

Which API (see ``api``): ``GET /api/public/v2/observations``, the read path of Langfuse v4 and Cloud, lists
the window's root observations (``isRootObservation=true``, core and basic fields) and then reads each trace
(``traceId``, the core, basic, io and metadata fields); a server without it (Langfuse v3, which answers 404) is read
through the v1 endpoints instead, ``GET /api/public/traces`` (``orderBy=timestamp.asc``) and ``GET
/api/public/observations?traceId=``. Langfuse marks the v1 reads deprecated on Cloud; v3 self-hosted has only them.

A trace is in the window when its root observation starts in it (``since`` inclusive, ``until`` exclusive, until now
when not given: fixed when the scan starts, so a resumed scan reads the same window). A trace whose root never
reached Langfuse has no root observation: the v2 listing finds it only with ``ScanQuery(rootless=True)``, which lists
every observation of the window (a trace is then in the window when any of its observations starts in it).

With ``cursor`` (a path), a scan that stops (an error, Ctrl-C) resumes where it stopped: the cursor file records the
query, the window, which API answered, the listing read so far (its traces in a ``.traces`` file beside it, one per
line) and how many traces were judged. Traces judged before the stop are not judged again; the runs of a session
that goes on past the stop, and runs still waiting for a root, are read again without being reported, so that the
detector's memory is what it would have been. A scan that finishes removes its cursor.

With ``score=True`` each run's findings go back to its trace as the ``loop_anomaly`` score the live path posts
(``LangfuseScores.anomaly``): one per anomaly type, categorical, the detector's message as the comment, the root
span's id in the metadata, the trace's environment, and the same deterministic id, so scanning again updates those
scores instead of adding to them. Runs assembled from a session (model calls alone in their traces) have no one
trace to score and are not scored, as under `looptrace watch`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..detector import DetectorConfig
from ..offline.conversations import CONVERSATION_PREFIX
from ..offline.readers import SESSION_PREFIX
from ..offline.trace_detect import DETECTION_KEYS, RunRebuilder, Verdict
from ..recording import semconv as sc
from ..settings import safe_url
from ..tracefile.read import SpanRecord
from .api import (
    OBSERVATIONS_PATH,
    TRACES_PATH,
    V1_MAX_LIMIT,
    V2_MAX_LIMIT,
    LangfuseAPI,
    LangfuseRequestRejected,
    MalformedPage,
    is_missing_route,
)
from .observations import epoch_ms, trace_spans
from .scores import anomaly_score_body, loop_cost_score_body

CURSOR_FORMAT = "looptrace-langfuse-scan"
CURSOR_VERSION = 1
V2_TRACE_FIELDS = "core,basic,io,metadata"
# The attributes detection reads, named as the v4 store flattens them: older v4 servers cut other metadata values
# at 200 characters unless they are named here (``expandMetadata``); newer ones return it whole with ``io``.
EXPANDED_METADATA = ",".join(f"attributes.{key}" for key in sorted({*DETECTION_KEYS, sc.TURN_INDEX}))


class CursorError(Exception):
    """A cursor file that cannot be resumed: unreadable, or written by a scan of another query or project."""


@dataclass(frozen=True)
class ScanQuery:
    """Which traces to read. Every filter given must match; a naive datetime is taken as UTC."""

    since: datetime | None = None
    until: datetime | None = None
    session_id: str | None = None
    user_id: str | None = None
    tags: tuple[str, ...] = ()  # traces holding all of them
    environments: tuple[str, ...] = ()  # traces in any of them
    # Also the traces whose root never reached Langfuse (a process that crashed or was killed mid-run: often the
    # very runs that looped). The v2 listing then reads every observation of the window instead of the roots only;
    # the v1 listing (whole traces) always has them.
    rootless: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"since": _iso(self.since), "until": _iso(self.until), "session_id": self.session_id,
                "user_id": self.user_id, "tags": sorted(self.tags), "environments": sorted(self.environments),
                "rootless": self.rootless}


@dataclass(frozen=True)
class ScanProgress:
    """Where a scan is, for a progress display: ``phase`` is listing, reading, waiting (a retry's pause, ``wait_s``
    long, for ``reason``) or done. ``total`` is known once the listing is complete."""

    phase: str
    api: str | None
    listed: int
    judged: int
    total: int | None
    anomalies: int
    scores_posted: int
    wait_s: float = 0.0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ListedTrace:
    """A trace the query selected: its id, its root's start (ISO 8601), its session and environment in Langfuse."""

    trace_id: str
    start: str
    session_id: str | None
    environment: str | None

    def as_row(self) -> list[str | None]:
        return [self.trace_id, self.start, self.session_id, self.environment]

    @classmethod
    def from_row(cls, row: Any) -> ListedTrace:
        trace_id, start, session_id, environment = row
        return cls(str(trace_id), str(start), session_id, environment)


# --- the scan -------------------------------------------------------------------------------------------------------


def scan(client: LangfuseAPI, query: ScanQuery | None = None, *, detector_config: DetectorConfig | None = None,
         score: bool = False, cursor: str | os.PathLike[str] | None = None,
         on_progress: Callable[[ScanProgress], None] | None = None,
         page_size: int | None = None) -> Iterator[Verdict]:
    """The verdict of every run among the traces ``query`` selects, as `looptrace detect` gives it, oldest first.

    Raises ``LangfuseAuthError`` (keys refused), ``LangfuseUnavailable`` (no answer, even after retries),
    ``LangfuseRequestRejected``, ``MalformedPage`` or ``CursorError``; with a ``cursor``, what was read before the
    error is kept there and the same call resumes from it.
    """
    query = query or ScanQuery()
    state = ScanState.open(cursor, query, client.base_url)
    report = _Reporter(on_progress, state)
    waiting_before = client.on_wait
    if on_progress is not None:
        client.on_wait = report.waiting
    try:
        source = _list(client, query, state, report, page_size)
        judge = _Judge(source, state, report, RunRebuilder(detector_config), client if score else None)
        yield from judge.run()
        state.complete()
        report("done")
    finally:
        client.on_wait = waiting_before


def _list(client: LangfuseAPI, query: ScanQuery, state: ScanState, report: _Reporter,
          page_size: int | None) -> _Source:
    """The listing, read to its end (from where an earlier scan left it); the source that answered."""
    source: _Source = _V2Source(client, page_size) if state.api != _V1Source.name else _V1Source(client, page_size)
    if state.listing_done:
        return source
    while True:
        state.api = source.name
        report("listing")
        try:
            for rows, following in source.roots(query, state.until, state.listing_next):
                state.add_listed([row for row in rows if _selected(row, query)], following)
                report("listing")
            state.listing_next, state.listing_done = None, True
            state.save()
            return source
        except MalformedPage as error:
            raise _in_context(error, "listing the traces", state) from None
        except LangfuseRequestRejected as error:
            if not (isinstance(source, _V2Source) and is_missing_route(error) and not state.listed):
                raise
            source = _V1Source(client, page_size)  # a Langfuse without the v2 read path: v3, or v4 before it


def _selected(row: ListedTrace, query: ScanQuery) -> bool:
    """What the server was asked to filter, checked again on what it returned (older v4 servers ignore filters
    they did not know yet, such as sessionId)."""
    if query.session_id is not None and row.session_id is not None and row.session_id != query.session_id:
        return False
    return not (query.environments and row.environment is not None and row.environment not in query.environments)


class _Judge:
    """Reads the listed traces one by one, feeds their spans to the rebuilder, scores and reports the verdicts."""

    def __init__(self, source: _Source, state: ScanState, report: _Reporter, rebuilder: RunRebuilder,
                 scorer: LangfuseAPI | None) -> None:
        self.source = source
        self.state = state
        self.report = report
        self.rebuilder = rebuilder
        self.scorer = scorer
        self.traces = state.ordered_traces()
        self.by_id = {trace.trace_id: trace for trace in self.traces}
        report.total = len(self.traces)
        self.open_runs: dict[str, set[int]] = {key: set(indices) for key, indices in state.open_runs.items()}
        self.roots: dict[str, str] = {}  # trace id -> root span id, for the traces whose runs are still open

    def run(self) -> Iterator[Verdict]:
        state = self.state
        for index in self._to_read_again():
            self._feed(index)  # what these runs said was reported before the stop: only the memory is rebuilt
        for index in range(state.judged, len(self.traces)):
            verdicts = self._feed(index)
            self._score(verdicts)
            self.roots = {trace_id: root for trace_id, root in self.roots.items() if trace_id in self.open_runs}
            state.judged = index + 1
            state.open_runs = {key: sorted(indices) for key, indices in self.open_runs.items()}
            state.save()
            self.report("reading", verdicts)
            yield from verdicts
        # Runs whose root never came, and runs assembled from sessions: judged once every trace was read. Each is
        # marked reported before it is handed out, so a stop among them does not hand it out twice.
        verdicts = [v for v in self.rebuilder.finish() if v.trace_id not in state.reported_last]
        self._score(verdicts)
        self.report("reading", verdicts)
        for verdict in verdicts:
            state.reported_last.append(verdict.trace_id)
            state.save()
            yield verdict

    def _to_read_again(self) -> list[int]:
        judged = self.state.judged
        ongoing = {trace.session_id for trace in self.traces[judged:] if trace.session_id}
        again = {index for indices in self.open_runs.values() for index in indices}
        again.update(index for index in range(judged) if self.traces[index].session_id in ongoing)
        return sorted(index for index in again if index < judged)

    def _feed(self, index: int) -> list[Verdict]:
        listed = self.traces[index]
        try:
            observations = self.source.observations(listed.trace_id)
        except MalformedPage as error:
            raise _in_context(error, f"reading trace {listed.trace_id}", self.state) from None
        spans = trace_spans(observations, session_id=listed.session_id)
        root = _root_of(spans)
        if root is not None:
            self.roots[listed.trace_id] = root
        verdicts, keys = [], set()
        for span in spans:
            verdict = self.rebuilder.add(span)
            keys.add(self.rebuilder.last_key)  # the run it joined: its trace, session or conversation
            if verdict is not None:
                verdicts.append(verdict)
        still_open = set(self.rebuilder.open_runs())
        for key in keys & still_open:
            self.open_runs.setdefault(key, set()).add(index)
        for key in [key for key in self.open_runs if key not in still_open]:
            del self.open_runs[key]
        return verdicts

    def _score(self, verdicts: list[Verdict]) -> None:
        for verdict in verdicts:
            root = self.roots.pop(verdict.trace_id, None)
            rootless = verdict.trace_id.startswith((SESSION_PREFIX, CONVERSATION_PREFIX))  # no one trace to score
            if self.scorer is None or not verdict.anomalies or rootless:
                continue
            listed = self.by_id.get(verdict.trace_id)
            environment = listed.environment if listed is not None else None
            latest = {anomaly.type: anomaly for anomaly in verdict.anomalies}  # one score per type: the latest
            for anomaly in latest.values():
                self.scorer.post_score(anomaly_score_body(verdict.trace_id, anomaly.type, anomaly.message,
                                                          span_id=root, environment=environment, cost=anomaly.cost))
                self.state.scores_posted += 1
            for anomaly_type, cost in verdict.loop_cost_by_type.items():  # what its loops cost, for alerts to sum
                body = loop_cost_score_body(verdict.trace_id, anomaly_type, cost, span_id=root, environment=environment)
                if body is not None:
                    self.scorer.post_score(body)
                    self.state.scores_posted += 1


def _in_context(error: MalformedPage, doing: str, state: ScanState) -> MalformedPage:
    kept = f"; what was read before it is kept in {state.path}" if state.path is not None else ""
    return MalformedPage(f"{error} ({doing}{kept})", error.endpoint, error.page)


def _root_of(spans: list[SpanRecord]) -> str | None:
    """The span that stands for the run, as the live path names it in a score: the agent span (the last, as the
    spans come children first), else the trace's root; None when neither reached Langfuse."""
    agents = [span for span in spans if span.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OPERATION_INVOKE_AGENT]
    roots = [span for span in spans if span.parent_span_id is None]
    chosen = agents or roots
    return chosen[-1].span_id if chosen else None


# --- where the traces come from -------------------------------------------------------------------------------------


class _Source:
    name = ""

    def roots(self, query: ScanQuery, until: str,
              following: Any) -> Iterator[tuple[list[ListedTrace], str | int | None]]:
        """Pages of listed traces, each with where the listing goes on. ``following`` is where it starts: what a page
        of this source said (a cursor, a page number), read back from a cursor file as it was saved."""
        raise NotImplementedError

    def observations(self, trace_id: str) -> list[dict[str, Any]]:
        raise NotImplementedError


class _V2Source(_Source):
    """``GET /api/public/v2/observations``: root observations for the listing, then each trace's observations."""

    name = "v2"

    def __init__(self, client: LangfuseAPI, page_size: int | None) -> None:
        self.client = client
        self.limit = min(page_size or V2_MAX_LIMIT, V2_MAX_LIMIT)

    def roots(self, query: ScanQuery, until: str,
              following: Any) -> Iterator[tuple[list[ListedTrace], str | int | None]]:
        params: dict[str, Any] = {
            "fields": "core,basic", "isRootObservation": None if query.rootless else True, "limit": self.limit,
            "fromStartTime": _iso(query.since), "toStartTime": until, "userId": query.user_id,
            "sessionId": query.session_id, "environment": list(query.environments),
        }
        if query.tags:
            params["filter"] = json.dumps([{"type": "arrayOptions", "column": "tags", "operator": "all of",
                                            "value": list(query.tags)}])
        for page in self.client.v2_observations(params, cursor=following):
            rows = [ListedTrace(str(item["traceId"]).lower(), str(item.get("startTime") or ""),
                                item.get("sessionId"), item.get("environment"))
                    for item in page.items if item.get("traceId") and (query.rootless or _is_root(item))]
            yield rows, page.following

    def observations(self, trace_id: str) -> list[dict[str, Any]]:
        params = {"traceId": trace_id, "fields": V2_TRACE_FIELDS, "expandMetadata": EXPANDED_METADATA,
                  "limit": self.limit}
        return [item for page in self.client.v2_observations(params) for item in page.items]


def _is_root(item: dict[str, Any]) -> bool:
    # A server that does not know isRootObservation ignores the filter (zod drops unknown parameters) and sends
    # every observation: the roots are the ones without a parent.
    if "isRootObservation" in item:
        return item["isRootObservation"] is True
    return not item.get("parentObservationId")


class _V1Source(_Source):
    """``GET /api/public/traces`` for the listing and ``GET /api/public/observations?traceId=`` for each trace."""

    name = "v1"

    def __init__(self, client: LangfuseAPI, page_size: int | None) -> None:
        self.client = client
        self.limit = min(page_size or V1_MAX_LIMIT, V1_MAX_LIMIT)

    def roots(self, query: ScanQuery, until: str,
              following: Any) -> Iterator[tuple[list[ListedTrace], str | int | None]]:
        params: dict[str, Any] = {
            "limit": self.limit, "orderBy": "timestamp.asc", "fields": "core", "fromTimestamp": _iso(query.since),
            "toTimestamp": until, "userId": query.user_id, "sessionId": query.session_id, "tags": list(query.tags),
            "environment": list(query.environments),
        }
        for page in self.client.v1_pages(TRACES_PATH, params, page=following or 1):
            rows = [ListedTrace(str(item["id"]).lower(), str(item.get("timestamp") or ""), item.get("sessionId"),
                                item.get("environment")) for item in page.items]
            yield rows, page.following

    def observations(self, trace_id: str) -> list[dict[str, Any]]:
        params = {"traceId": trace_id, "limit": self.limit}
        return [item for page in self.client.v1_pages(OBSERVATIONS_PATH, params) for item in page.items]


# --- what a scan remembers ------------------------------------------------------------------------------------------


@dataclass
class ScanState:
    """A scan's progress, kept in a cursor file (and a ``.traces`` file beside it) when it has a path."""

    path: Path | None
    base_url: str
    query: dict[str, Any]
    until: str
    api: str | None = None
    listing_next: Any = None
    listing_done: bool = False
    listed: list[ListedTrace] = field(default_factory=list)
    judged: int = 0
    open_runs: dict[str, list[int]] = field(default_factory=dict)
    reported_last: list[str] = field(default_factory=list)  # runs judged after the last trace, already handed out
    scores_posted: int = 0  # this run's, not saved
    _known: set[str] = field(init=False, repr=False)  # the ids of the listed traces

    def __post_init__(self) -> None:
        self._known = {row.trace_id for row in self.listed}

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None, query: ScanQuery, base_url: str) -> ScanState:
        """The state of the scan ``path`` records, or a new one (until now when the query gives no end)."""
        until = _iso(query.until) or _iso(datetime.now(UTC))
        fresh = cls(Path(path) if path is not None else None, safe_url(base_url), query.as_dict(), until or "")
        if fresh.path is None or not fresh.path.exists():
            return fresh
        try:
            saved = json.loads(fresh.path.read_text(encoding="utf-8"))
            if saved.get("format") != CURSOR_FORMAT or saved.get("version") != CURSOR_VERSION:
                raise ValueError("not a looptrace scan cursor")
            rows = fresh._traces_file().read_text(encoding="utf-8").splitlines() if saved["listed"] else []
            listed = [ListedTrace.from_row(json.loads(row)) for row in rows[:saved["listed"]]]
            if len(listed) != saved["listed"]:
                raise ValueError(f"its traces file holds {len(listed)} of {saved['listed']} listed traces")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CursorError(f"cannot resume from {fresh.path}: {exc}; remove it to scan from the start") from None
        if saved.get("base_url") != fresh.base_url or saved.get("query") != fresh.query:
            raise CursorError(f"{fresh.path} is the cursor of another scan ({saved.get('base_url')}, "
                              f"{saved.get('query')}); use another cursor file, or remove it to scan from the start")
        state = replace(fresh, until=str(saved["until"]), api=saved.get("api"), listing_next=saved.get("listing_next"),
                        listing_done=bool(saved.get("listing_done")), listed=listed, judged=int(saved.get("judged", 0)),
                        open_runs={str(k): [int(i) for i in v] for k, v in (saved.get("open_runs") or {}).items()},
                        reported_last=[str(key) for key in saved.get("reported_last") or ()])
        state._write_traces(listed, append=False)  # lines past the count were written by an interrupted save
        return state

    def add_listed(self, rows: list[ListedTrace], following: str | int | None) -> None:
        """A page of the listing; a trace already listed (another of its observations, in a rootless listing) is
        kept once."""
        fresh = []
        for row in rows:
            if row.trace_id not in self._known:
                self._known.add(row.trace_id)
                fresh.append(row)
        self._write_traces(fresh, append=True)
        self.listed.extend(fresh)
        self.listing_next = following
        self.listing_done = following is None
        self.save()

    def ordered_traces(self) -> list[ListedTrace]:
        """The listed traces, each once, oldest root first: the order runs are judged in, the same on every resume."""
        first: dict[str, ListedTrace] = {}
        for row in sorted(self.listed, key=lambda row: (epoch_ms(row.start) or 0, row.trace_id)):
            first.setdefault(row.trace_id, row)
        return list(first.values())

    def save(self) -> None:
        if self.path is None:
            return
        saved = {"format": CURSOR_FORMAT, "version": CURSOR_VERSION, "base_url": self.base_url, "query": self.query,
                 "until": self.until, "api": self.api, "listing_next": self.listing_next,
                 "listing_done": self.listing_done, "listed": len(self.listed), "judged": self.judged,
                 "open_runs": self.open_runs, "reported_last": self.reported_last}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(saved), encoding="utf-8")
        os.replace(temporary, self.path)

    def complete(self) -> None:
        """The scan finished: its cursor has nothing left to resume."""
        if self.path is None:
            return
        for path in (self.path, self._traces_file()):
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    def _traces_file(self) -> Path:
        assert self.path is not None
        return self.path.with_name(self.path.name + ".traces")

    def _write_traces(self, rows: list[ListedTrace], *, append: bool) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._traces_file(), "a" if append else "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row.as_row()) + "\n" for row in rows)


class _Reporter:
    """Counts what was judged and tells ``on_progress``."""

    def __init__(self, on_progress: Callable[[ScanProgress], None] | None, state: ScanState) -> None:
        self.on_progress = on_progress
        self.state = state
        self.anomalies = 0
        self.total: int | None = None  # the number of traces to read, once the listing is complete

    def __call__(self, phase: str, verdicts: Sequence[Verdict] = ()) -> None:
        self.anomalies += sum(len(verdict.anomalies) for verdict in verdicts)
        if self.on_progress is not None:
            self.on_progress(self._progress(phase))

    def waiting(self, seconds: float, reason: str) -> None:
        if self.on_progress is not None:
            self.on_progress(replace(self._progress("waiting"), wait_s=seconds, reason=reason))

    def _progress(self, phase: str) -> ScanProgress:
        state = self.state
        return ScanProgress(phase=phase, api=state.api, listed=len(state.listed), judged=state.judged,
                            total=self.total,
                            anomalies=self.anomalies, scores_posted=state.scores_posted)


def _iso(moment: datetime | None) -> str | None:
    """A time as Langfuse's API takes it: ISO 8601 in UTC, to the millisecond."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

