"""A client for the parts of Langfuse's public REST API that reading traces back needs: pages, rate limits, errors.

Endpoints, as Langfuse's API definition (langfuse/langfuse, fern/apis/server/definition) and its server routes
(web/src/pages/api/public) have them:

- ``GET /api/public/v2/observations`` (observations.yml ``getMany``): Langfuse v4 and Cloud. Cursor pages: the
  response is ``{"data": [...], "meta": {"cursor": "..."}}`` and the cursor is absent on the last page; ``limit`` at
  most 1000. Field groups (``fields``): ``core`` is always there (id, traceId, startTime, endTime, parentObservationId,
  type), ``basic`` (name, level, statusMessage, environment, userId, sessionId, isRootObservation), ``io`` (input,
  output: the stored text), ``metadata``; without ``fields`` only core and basic come back. A server without the v2
  read path (Langfuse v3 self-hosted) answers 404 (501 before March 2026).
- ``GET /api/public/traces`` (trace.yml ``list``) and ``GET /api/public/observations`` (legacy/observations-v1.yml):
  Langfuse v3 and v4 outside events-only mode. Numbered pages from 1, ``{"data": [...], "meta": {"page", "limit",
  "totalItems", "totalPages"}}``; ``limit`` at most 100.
- ``POST /api/public/scores`` (scores.yml ``create``): one ``CreateScoreRequest``; a known id updates its score.
- ``GET /api/public/projects``: the project the keys belong to, ``{"data": [{"id", "name", ...}]}`` (``TraceLinks``).

This is looptrace's one client for Langfuse's public API: the scan reads through it, scores are posted through it
(``scores``) and the trace links ask it for the project. Not the ``langfuse`` package's own API client: that
one imports in about 0.55 s against 0.08 s for ``requests`` (``python benchmarks/langfuse_client_cost.py``), costs
the same per call, posts scores as a batch (a JSON list, which servers older than the batch endpoint refuse) where
one object works on every version, and refuses a response its models do not expect (a project without
``organization``), where a scan must read whatever a server of any version sends.

Authentication is HTTP Basic with the project's public key as user and secret key as password; 401 means a key was
refused, 403 a key without access (an organisation key). A rate-limited request gets 429 with ``Retry-After`` in
whole seconds (web/src/features/public-api/server/RateLimitService.ts).

The keys are never part of a message, a repr or a log line: errors name the endpoint (scheme, host, path) and the
status, and any text the server sends back is cleaned of both keys before it is quoted.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from ..logs import log
from ..settings import LangfuseSettings, safe_url
from .failures import caused_by_refusal

V2_OBSERVATIONS_PATH = "/api/public/v2/observations"
TRACES_PATH = "/api/public/traces"
OBSERVATIONS_PATH = "/api/public/observations"
SCORES_PATH = "/api/public/scores"
V2_MAX_LIMIT = 1000
V1_MAX_LIMIT = 100
_NOT_THERE = (404, 501)  # how a server says it has no such read path
_RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
_QUOTED_CHARS = 200


class LangfuseAPIError(Exception):
    """Langfuse's API could not give what was asked; the message says which endpoint and why, never a key.
    ``status`` is the HTTP status of the last answer, ``transport`` the exception of a request that got none."""

    status: int | None = None
    transport: BaseException | None = None


class LangfuseAuthError(LangfuseAPIError):
    """The keys were refused (401) or have no access to the project's data (403)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class LangfuseUnavailable(LangfuseAPIError):
    """The server did not answer, or kept answering with a server error, through every retry allowed."""

    def __init__(self, message: str, *, status: int | None = None, transport: BaseException | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.transport = transport


class LangfuseRateLimited(LangfuseUnavailable):
    """Still rate limited (429) when the retries allowed ran out."""


class LangfuseRequestRejected(LangfuseAPIError):
    """The server refused the request itself (a 4xx other than 401, 403 and 429): a bad filter, a missing route."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class MalformedPage(LangfuseAPIError):
    """A page that is not what the API defines (not JSON, no ``data`` list, an item without its id). The pages before
    it were read and kept; ``endpoint`` and ``page`` (counted from 1 in this read) say which one it was."""

    def __init__(self, message: str, endpoint: str, page: int) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.page = page


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep trying: ``max_attempts`` per request, ``max_retries`` over the client's life, each wait at
    most ``max_wait_s`` (a longer ``Retry-After`` is cut to it), and backoff ``backoff_s`` x 2^n without one."""

    max_attempts: int = 6
    max_retries: int = 60
    max_wait_s: float = 60.0
    backoff_s: float = 1.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.max_retries < 0 or self.max_wait_s < 0 or self.backoff_s < 0:
            raise ValueError("RetryPolicy: attempts >= 1, retries, waits and backoff >= 0")


@dataclass(frozen=True, slots=True)
class Page:
    """One page of items; ``following`` is what asks for the next one (a cursor, a page number), None after the last.
    ``number`` counts the pages of this read from 1."""

    items: list[dict[str, Any]]
    following: str | int | None
    number: int


class LangfuseAPI:
    """Langfuse's public API for one project, over one HTTP session. Not thread-safe: one scan at a time.

    ``sleep`` is how the client waits before a retry (inject it in tests); ``on_wait(seconds, reason)`` hears of each
    wait before it starts, for a progress display.
    """

    def __init__(self, base_url: str, public_key: str, secret_key: str, *, timeout_s: float = 30.0,
                 retry: RetryPolicy | None = None, sleep: Callable[[float], None] = time.sleep,
                 on_wait: Callable[[float, str], None] | None = None, session: requests.Session | None = None) -> None:
        if not public_key or not secret_key:
            raise ValueError("Langfuse needs both the public and the secret key")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self.sleep = sleep
        self.on_wait = on_wait
        self.retries_used = 0
        self._secrets = (public_key, secret_key)
        token = base64.b64encode(f"{public_key}:{secret_key}".encode()).decode("ascii")
        self._headers = {"Authorization": f"Basic {token}", "Accept": "application/json"}
        self._session = session or requests.Session()

    @classmethod
    def from_settings(cls, settings: LangfuseSettings, **options: Any) -> LangfuseAPI:
        """The client for the project ``LANGFUSE_*`` configures (``LangfuseSettings.from_env()``)."""
        options.setdefault("timeout_s", max(settings.timeout_s, 30.0))
        return cls(settings.base_url, settings.public_key, settings.secret_key, **options)

    def __repr__(self) -> str:
        return f"LangfuseAPI({safe_url(self.base_url)!r})"

    def close(self) -> None:
        self._session.close()

    # -- pages -----------------------------------------------------------------------------------------------------

    def v2_observations(self, params: Mapping[str, Any], *, cursor: str | None = None) -> Iterator[Page]:
        """``GET /api/public/v2/observations`` page after page, from ``cursor`` (None: the first page)."""
        number = 0
        while True:
            number += 1
            query = dict(params)
            if cursor:
                query["cursor"] = cursor
            body = self.get(V2_OBSERVATIONS_PATH, query, page=number)
            items = _items(body, V2_OBSERVATIONS_PATH, number, self._where(V2_OBSERVATIONS_PATH))
            meta = body.get("meta")
            if meta is not None and not isinstance(meta, dict):
                raise self._malformed(V2_OBSERVATIONS_PATH, number, "meta is not an object")
            following = (meta or {}).get("cursor")
            if following is not None and not isinstance(following, str):
                raise self._malformed(V2_OBSERVATIONS_PATH, number, "meta.cursor is not a string")
            if following and following == cursor:  # the same page again would never end
                raise self._malformed(V2_OBSERVATIONS_PATH, number, "meta.cursor points at the page itself")
            yield Page(items, following or None, number)
            if not following:
                return
            cursor = following

    def v1_pages(self, path: str, params: Mapping[str, Any], *, page: int = 1) -> Iterator[Page]:
        """A numbered-page endpoint (``/api/public/traces``, ``/api/public/observations``) from ``page`` to its last."""
        number = 0
        while True:
            number += 1
            body = self.get(path, {**params, "page": page}, page=number)
            items = _items(body, path, number, self._where(path))
            meta = body.get("meta")
            total = meta.get("totalPages") if isinstance(meta, dict) else None
            if not isinstance(total, int) or isinstance(total, bool):
                raise self._malformed(path, number, "meta.totalPages is not a number")
            last = page >= total or not items
            yield Page(items, None if last else page + 1, number)
            if last:
                return
            page += 1

    def post_score(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /api/public/scores``: one score; a body whose ``id`` exists updates that score."""
        return self.request("POST", SCORES_PATH, json_body=dict(body))

    # -- one request -----------------------------------------------------------------------------------------------

    def get(self, path: str, params: Mapping[str, Any], *, page: int = 1) -> dict[str, Any]:
        return self.request("GET", path, params=params, page=page)

    def request(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
                json_body: Any = None, page: int = 1) -> dict[str, Any]:
        """One call, retried on 429, 5xx and connection failures as the policy allows; the JSON object it returned."""
        url = self.base_url + path
        where = self._where(path)
        attempt = 0
        while True:
            attempt += 1
            failure: LangfuseAPIError
            try:
                response = self._session.request(method, url, params=_query(params), json=json_body,
                                                 headers=self._headers, timeout=self.timeout_s)
            except (requests.ConnectionError, requests.Timeout) as exc:
                timed_out = isinstance(exc, requests.Timeout)
                if not timed_out and caused_by_refusal(exc):  # nothing listens there, or no such host: no retry
                    raise LangfuseUnavailable(f"cannot connect to Langfuse at {where} (connection refused or host "
                                              "not found): is it running? check LANGFUSE_BASE_URL",
                                              transport=exc) from None
                reason = "no answer in time (timed out)" if timed_out else "cannot connect (connection failed)"
                wait = self._backoff(attempt)
                failure = LangfuseUnavailable(f"Langfuse at {where}: no answer in time (timed out)" if timed_out
                                              else f"cannot connect to Langfuse at {where} (connection failed)",
                                              transport=exc)
            else:
                status = response.status_code
                if 200 <= status < 300:
                    return self._json(response, path, page)
                if status in (401, 403):
                    what = "refused the API keys" if status == 401 else "denied the API keys access"
                    raise LangfuseAuthError(
                        f"Langfuse at {where} {what} ({status}{self._said(response)}): check LANGFUSE_PUBLIC_KEY, "
                        f"LANGFUSE_SECRET_KEY and LANGFUSE_BASE_URL (a project's keys, not an organisation's)", status)
                if status not in _RETRIED_STATUSES:
                    raise LangfuseRequestRejected(f"Langfuse at {where} rejected the request ({status}"
                                                  f"{self._said(response)})", status)
                retry_after = _retry_after(response.headers.get("Retry-After"))
                wait = retry_after if retry_after is not None else self._backoff(attempt)
                if status == 429:
                    reason = "rate limited (429)"
                    failure = LangfuseRateLimited(f"Langfuse at {where} is still rate limiting (429) after "
                                                  f"{attempt} attempts", status=status)
                else:
                    reason = f"server error ({status})"
                    failure = LangfuseUnavailable(f"Langfuse at {where} keeps failing ({status}{self._said(response)})"
                                                  f" after {attempt} attempts", status=status)
            if attempt >= self.retry.max_attempts or self.retries_used >= self.retry.max_retries:
                raise failure from None
            self.retries_used += 1
            wait = min(max(wait, 0.0), self.retry.max_wait_s)
            if self.on_wait is not None:
                self.on_wait(wait, reason)
            self.sleep(wait)

    # -- helpers ---------------------------------------------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        return self.retry.backoff_s * (2 ** (attempt - 1))

    def _where(self, path: str) -> str:
        return safe_url(self.base_url + path)

    def _json(self, response: requests.Response, path: str, page: int) -> dict[str, Any]:
        try:
            body = response.json()
        except ValueError as exc:
            raise self._malformed(path, page, f"not JSON ({type(exc).__name__})") from None
        if not isinstance(body, dict):
            raise self._malformed(path, page, f"a JSON {type(body).__name__}, not an object")
        return body

    def _malformed(self, path: str, page: int, reason: str) -> MalformedPage:
        return MalformedPage(f"page {page} from {self._where(path)} is malformed: {self._clean(reason)}",
                             path, page)

    def _said(self, response: requests.Response) -> str:
        """The server's own message, cleaned of the keys and cut short: ': "..."', or nothing."""
        try:
            body = response.json()
            text = body.get("message") or body.get("error") if isinstance(body, dict) else None
        except ValueError:
            text = None
        if not isinstance(text, str) or not text.strip():
            return ""
        return f': "{self._clean(text.strip())[:_QUOTED_CHARS]}"'

    def _clean(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


def is_missing_route(error: LangfuseAPIError) -> bool:
    """Whether an error says the server has no such read path (an older or newer Langfuse), not a bad request."""
    return isinstance(error, LangfuseRequestRejected) and error.status in _NOT_THERE


def _items(body: dict[str, Any], path: str, number: int, where: str) -> list[dict[str, Any]]:
    data = body.get("data")
    if not isinstance(data, list):
        raise MalformedPage(f"page {number} from {where} is malformed: no data list", path, number)
    for position, item in enumerate(data):
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
            raise MalformedPage(f"page {number} from {where} is malformed: item {position} has no id", path, number)
    return data


def _query(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Query parameters as Langfuse parses them: booleans as true/false, lists as repeated keys, None left out."""
    if params is None:
        return None
    query: dict[str, Any] = {}
    for key, value in params.items():
        if value is None or value == [] or value == ():
            continue
        query[key] = ("true" if value else "false") if isinstance(value, bool) else (
            list(value) if isinstance(value, (list, tuple)) else value)
    return query


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds: a number, or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(moment.timestamp() - time.time(), 0.0)


# --- a link to the trace in Langfuse's UI ---------------------------------------------------------------------------

PROJECTS_PATH = "/api/public/projects"  # "Get Project associated with API key": {"data": [{"id", "name"}]}
PROJECT_LOOKUP_TIMEOUT_S = 2.0


class TraceLinks:
    """Links to traces in the Langfuse UI: ``{base_url}/project/{project id}/traces/{trace id}``.

    The project id is what the keys belong to, asked once of the public API (``GET /api/public/projects``) on a
    background thread as soon as this is made, and kept: in memory for the process and in the user's cache directory
    for the next one, keyed by a hash of the base URL and the public key (never the secret). ``url()`` waits for a
    lookup still on the wire at most ``wait_s``; a lookup that failed, or a server that does not answer, gives None:
    no link, never an error, never more than a short wait.
    """

    _known: dict[str, str] = {}  # cache key -> project id, for every TraceLinks of the process
    _lookups: dict[str, threading.Thread] = {}  # cache key -> the process's one lookup of it
    _lock = threading.Lock()

    def __init__(self, settings: LangfuseSettings, *, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.base_url = settings.base_url.rstrip("/")
        self._settings = settings
        self._key = hashlib.sha256(f"{self.base_url}\n{settings.public_key}".encode()).hexdigest()[:32]
        self._cache_file = _cache_file(cache_dir if cache_dir is not None else settings.cache_home, cache_dir is None)
        self.project_id: str | None = self._cached()
        self._thread: threading.Thread | None = None
        if self.project_id is None:
            with self._lock:  # one lookup per project and process, however many agents ask: a failed one means no link
                self._thread = self._lookups.get(self._key)
                if self._thread is None:
                    self._thread = self._lookups[self._key] = threading.Thread(
                        target=self._look_up, name="looptrace-langfuse-project", daemon=True)
                    self._thread.start()

    def url(self, trace_id: str, *, wait_s: float = PROJECT_LOOKUP_TIMEOUT_S) -> str | None:
        """The trace's URL in the Langfuse UI, or None when the project is unknown (or the trace id is all zeros)."""
        if not trace_id or set(trace_id) == {"0"}:
            return None
        if self._thread is not None:
            self._thread.join(wait_s)
        with self._lock:
            project = self.project_id or self._known.get(self._key)
        return f"{self.base_url}/project/{project}/traces/{trace_id}" if project else None

    def _cached(self) -> str | None:
        with self._lock:
            if self._key in self._known:
                return self._known[self._key]
        try:
            stored = json.loads(self._cache_file.read_text(encoding="utf-8")) if self._cache_file else {}
        except (OSError, ValueError):
            return None
        project = stored.get(self._key) if isinstance(stored, dict) else None
        if isinstance(project, str) and project:
            with self._lock:
                self._known[self._key] = project
            return project
        return None

    def _look_up(self) -> None:
        api = LangfuseAPI(self.base_url, self._settings.public_key, self._settings.secret_key,
                          timeout_s=PROJECT_LOOKUP_TIMEOUT_S, retry=RetryPolicy(max_attempts=1, max_retries=0))
        try:
            projects = api.get(PROJECTS_PATH, {}).get("data")
            project = projects[0].get("id") if isinstance(projects, list) and projects else None
        except Exception as error:  # noqa: BLE001 - a link is a convenience: any failure just means no link
            log.debug("langfuse_project_lookup_failed", error=type(error).__name__, endpoint=safe_url(self.base_url))
            return
        finally:
            api.close()
        if not isinstance(project, str) or not project:
            return
        self.project_id = project
        with self._lock:
            self._known[self._key] = project
        self._remember(project)

    def _remember(self, project: str) -> None:
        if self._cache_file is None:
            return
        try:
            stored = json.loads(self._cache_file.read_text(encoding="utf-8")) if self._cache_file.exists() else {}
            stored = stored if isinstance(stored, dict) else {}
            stored[self._key] = project
            self._cache_file.parent.mkdir(parents=True, exist_ok=True)
            temporary = self._cache_file.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(stored), encoding="utf-8")
            os.replace(temporary, self._cache_file)
        except (OSError, ValueError):
            pass  # an unwritable cache costs one lookup per process, nothing more


def _cache_file(directory: str | os.PathLike[str] | None, cache_home: bool) -> Path:
    """The cache file in ``directory`` itself, or under a cache home (XDG_CACHE_HOME's, or ~/.cache)."""
    if not cache_home and directory is not None:
        return Path(directory) / "langfuse-projects.json"
    root = Path(directory) if directory is not None else Path.home() / ".cache"
    return root / "looptrace" / "langfuse-projects.json"
