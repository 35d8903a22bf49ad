"""Call identity and result digests: when two calls are the same call, and when two results are the same outcome.

A call is its tool and its canonical arguments (keys sorted, numbers normalised, per-call nonces left out); a result is
its digest (whitespace, UUIDs, date-times and long hex ids ignored). DESIGN.md says why each normalisation is safe.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any

_MAX_DEPTH = 64  # deeper structures are cut: json would recurse past Python's limit
_MAX_INT_BITS = 13_000  # ints longer than ~4,000 digits cannot go through str() in Python 3.11+
_MAX_TARGET_CHARS = 200

# Argument names that carry a per-call nonce, compared case-insensitively without "_" and "-". A value under such a
# name is fresh on every call by design, so it says nothing about what the call does.
NONCE_KEYS = frozenset({"requestid", "xrequestid", "clientrequestid", "idempotencykey", "nonce", "correlationid",
                        "traceid", "timestamp", "ts"})

# Per-call nonces in tool results: UUIDs, date-times with a time of day, and long hex ids (request ids, trace ids).
# Dates alone, numbers and short ids are data and stay.
_RESULT_NONCES = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
    r"|\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
    r"|\b[0-9a-fA-F]{24,}\b"
)
_MAX_NORMALISED_RESULT = 200_000  # longer results are digested as they are


# --------------------------------------------------------------------------- arguments


def canonical_arguments(args: object) -> str:
    """Compact JSON of `args` with keys sorted and numbers normalised; raw text if not JSON."""
    if isinstance(args, str):
        return _canonical_text(args)
    if type(args) is dict:
        flat = _flat_canonical(args)
        if flat is not None:
            return flat
    try:
        return _compact_json(_normalise(args, 0))
    except Exception:  # exotic objects whose __str__ fails, and the like
        return f"<unrepresentable {type(args).__qualname__}>"


@functools.lru_cache(maxsize=4096)  # stored traces give arguments as text, and a loop repeats the same text
def _canonical_text(text: str) -> str:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return normal_text(text)  # not JSON: the text is the only identity it has
    try:
        return _compact_json(_normalise(value, 0))
    except Exception:
        return f"<unrepresentable {type(value).__qualname__}>"


def _flat_canonical(args: dict[Any, Any]) -> str | None:
    """`canonical_arguments` of the usual arguments, a flat object of ASCII names and plain scalar values, written out
    in one pass; None for anything else (nested values, other names, NaN), which takes the general path.

    The same text as `_normalise` then `_compact_json` gives: ASCII is its own NFC form, so only the whitespace of a
    one-line string changes, and numbers only where a float is integral. Written here rather than by the encoder:
    `JSONEncoder.encode` sets up its machinery on every call, which costs more than this whole object.
    """
    try:
        names = sorted(args)  # as sort_keys sorts them
    except TypeError:  # names of several types: not this path's
        return None
    members: list[str] = []
    add, string, known = members.append, _json_string, _MEMBER_NAMES  # read once: this loop runs for every call
    for name in names:
        member = known.get(name)  # '"name":', or "" for a nonce name
        if member is None:
            if type(name) is not str or not name.isascii():
                return None
            member = _member_name(name)
        if not member:
            continue
        value = args[name]
        kind = type(value)
        if kind is str:
            if not value.isascii() or "\n" in value or "\r" in value:
                value = normal_text(value)
            else:
                value = " ".join(value.split())
            add(member + string(value))
        elif kind is int:
            if value.bit_length() > _MAX_INT_BITS:
                return None
            add(member + repr(value))
        elif kind is bool:
            add(member + ("true" if value else "false"))
        elif value is None:
            add(member + "null")
        elif kind is float and math.isfinite(value):
            add(member + (repr(int(value)) if value.is_integer() else repr(value)))
        else:
            return None
    return "{" + ",".join(members) + "}"


# The JSON text that starts a member, by argument name ("" for a nonce name, left out): a tool's argument names are
# few and come back on every call. Only ASCII str names are kept, and only so many.
_MEMBER_NAMES: dict[str, str] = {}
_MAX_MEMBER_NAMES = 1024


def _member_name(name: str) -> str:
    member = "" if _is_nonce_name(name) else _json_string(name) + ":"
    if len(_MEMBER_NAMES) < _MAX_MEMBER_NAMES:
        _MEMBER_NAMES[name] = member
    return member


def _normalise(value: object, depth: int) -> object:
    if depth > _MAX_DEPTH:
        return "<too deep>"
    if value is None or isinstance(value, bool):  # bool before int: True is not 1
        return value
    if isinstance(value, str):
        return normal_text(value)
    if isinstance(value, int):
        return value if value.bit_length() <= _MAX_INT_BITS else f"<int {value:x}>"
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else value
    if isinstance(value, Mapping):
        return {_key_text(k, depth): _normalise(v, depth + 1) for k, v in value.items() if not is_nonce_key(k)}
    if isinstance(value, (list, tuple)):
        return [_normalise(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_normalise(v, depth + 1) for v in value), key=_compact_json)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)  # Decimal, enums, custom objects: their text is the best identity we have


def _key_text(key: object, depth: int) -> str:
    # JSON keys are strings; a non-string key gets its canonical text so 1 and 1.0 agree.
    return unicodedata.normalize("NFC", key) if isinstance(key, str) else _compact_json(_normalise(key, depth + 1))


# json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False), with the encoder made once: dumps
# builds a new JSONEncoder on every call that passes options, and this runs for every call the detector sees.
_compact_json: Callable[[object], str] = json.JSONEncoder(sort_keys=True, separators=(",", ":"),
                                                          ensure_ascii=False).encode
# The string escaping that encoder uses (ensure_ascii off): the C one where the json package has it.
_json_string: Callable[[str], str] = json.encoder.encode_basestring


def is_nonce_key(key: object) -> bool:
    """Whether an argument name is one of `NONCE_KEYS` (any case, "_" and "-" ignored)."""
    return isinstance(key, str) and _is_nonce_name(key)


@functools.lru_cache(maxsize=1024)  # a tool's argument names are few and come back on every call
def _is_nonce_name(name: str) -> bool:
    return name.casefold().replace("_", "").replace("-", "") in NONCE_KEYS


def normal_text(text: str) -> str:
    """A string as the detector compares it: Unicode NFC, and whitespace that cannot change its meaning dropped.

    One-line strings (ids, queries, command lines) have runs of whitespace collapsed and their ends stripped;
    multi-line strings (code, file contents, where indentation matters) only lose trailing whitespace at line ends
    and at the end.
    """
    try:
        text = unicodedata.normalize("NFC", text)
    except (TypeError, ValueError):
        return text
    if "\n" not in text and "\r" not in text:
        return " ".join(text.split())
    return "\n".join(line.rstrip() for line in text.splitlines()).rstrip()


def call_targets(arguments: object) -> frozenset[str]:
    """What a call acted on: its top-level string arguments that read as one token (ids, paths, codes, emails).

    Free text (a message, a query with spaces, code) is not a target; neither are nested values.
    """
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return frozenset()
    if not isinstance(arguments, Mapping):
        return frozenset()
    targets = set()
    for key, value in arguments.items():
        if isinstance(value, str) and not is_nonce_key(key):
            value = normal_text(value)
            if value and len(value) <= _MAX_TARGET_CHARS and not any(c.isspace() for c in value):
                targets.add(value)
    return frozenset(targets)


# --------------------------------------------------------------------------- results and digests


def result_digest(text: str | None) -> str:
    """Short stable digest of a tool result's text: blake2b, 8 bytes, hex; "" for None.

    The text is normalised first (`normal_text`, then UUIDs, date-times and long hex ids replaced by one marker), so
    two results that differ only in a per-call nonce or in trailing whitespace are the same outcome.

    The span layer records this same function's value on every execute_tool span, so live and
    offline detection compare equal values.
    """
    if text is None:
        return ""
    if not isinstance(text, str):
        text = safe_text(text)
    if len(text) <= _MAX_CACHED_RESULT:
        return _result_digest_cached(text)
    return _result_digest(text)


def _result_digest(text: str) -> str:
    if len(text) <= _MAX_NORMALISED_RESULT:
        text = _RESULT_NONCES.sub("\x00", normal_text(text))
    return digest(text, size=8)


# The loop digests each result twice, for the detector and for the execute_tool span (live and offline detection must
# compare equal values): a few recent results are remembered so the second costs a lookup. Only results of a bounded
# size, so what the cache holds on to stays small.
_MAX_CACHED_RESULT = 16_384
_result_digest_cached = functools.lru_cache(maxsize=32)(_result_digest)


def call_key(tool: str, arguments: str) -> str:
    """A call's identity, to compare calls by: its tool and canonical arguments as they are when that is short, as
    most calls' is, else their digest. The two forms never meet: only the plain one holds a NUL."""
    key = tool + "\x00" + arguments
    return key if len(key) <= _MAX_PLAIN_KEY else digest(key)


def key_id(key: str) -> str:
    """Ten hex digits naming a call key in streak names: its digest's, whichever form the key has."""
    return (digest(key) if "\x00" in key else key)[:10]


# Keys this long are kept as they are: comparing them costs no more than a digest's, and digesting costs more.
_MAX_PLAIN_KEY = 256


def digest(text: str, size: int = 16) -> str:
    """blake2b of the text, hex: the detector's keys for calls, turn signatures and streaks."""
    # surrogatepass: a lone surrogate in a string must not make hashing fail
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=size).hexdigest()


def safe_text(value: object) -> str:
    """`str(value)`, or its type's name when even that fails: error texts and ids come from anywhere."""
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__qualname__}>"


def shorten(text: str, limit: int) -> str:
    """The text cut to `limit` characters, an ellipsis marking the cut."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


# --------------------------------------------------------------------------- failures


# What changes between two runs of the same failing command without the failure changing: numbers (counts, durations,
# line numbers, sizes), hex ids and hashes, UUIDs and time stamps, and file paths (the files a hook touched this time).
# Replaced by one marker each; the words around them (a check's name, an exception type, a test's name after "::")
# stay, so a different failure still reads as different.
_INCIDENTAL = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"  # UUIDs
    r"|(?:[\w.~-]*[/\\])+[\w.-]*|\b[\w-]+\.[A-Za-z][A-Za-z0-9]{0,4}\b(?=[\s:,;)\]'\"]|$)"  # paths, file names
    r"|\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{7,}\b"  # hex ids and hashes (a digit and a letter)
    r"|(?<![A-Za-z_])[-+]?\d+(?:[.,:]\d+)*"  # numbers, durations, times, line:column (not the digits of a name)
)
_MAX_FAILURE_LINES = 200  # of an error's text, the first lines are read: enough to tell one failure from another


def failure_signature(text: str | None) -> str:
    """What a failure is, with the incidental text that changes between two runs of it left out: the digest of its
    distinct non-empty lines once numbers, hex ids, UUIDs, time stamps and file paths are replaced by one marker
    each. "" for an unknown text.

    A commit rejected by the same hook reads the same however many files, seconds or line numbers it reports; another
    failing check, another exception type, another test name, another first line give another signature.
    """
    if text is None:
        return ""
    if not isinstance(text, str):
        text = safe_text(text)
    lines = set()
    for line in text[:_MAX_NORMALISED_RESULT].splitlines()[:_MAX_FAILURE_LINES]:
        line = " ".join(_INCIDENTAL.sub("#", unicodedata.normalize("NFC", line)).split())
        if line.strip("#.,:;-=*_ ()[]"):  # a line of markers and rules only says nothing about the failure
            lines.add(line)
    return digest("\n".join(sorted(lines)), size=8)
