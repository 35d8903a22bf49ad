"""Conversations told apart by their history: runs of model calls that share no parent span and no session id.

A plain SDK loop under an instrumentation makes one trace per model call, with no agent span around them and no
session id. Each call's input messages still hold the conversation so far, so successive calls of one conversation
have histories that extend one another. `ConversationIndex.place` keys a call by the fingerprint of its history,
prefix by prefix: the hash of the canonical messages up to each point, each hash chained on the one before.

- A call whose history extends an open conversation's latest history (its prefix of that length has the same hash)
  continues that conversation; the conversation's latest history becomes the call's.
- A call whose whole history is a point inside an open conversation's latest history, where no call was seen yet, is
  an earlier call of it that arrived late (spans need not come in order).
- Anything else starts a conversation of its own: a first call, a branch (a second continuation of a prefix that
  already went on differently), or a call whose history is a point where the conversation already had its call (two
  runs that started with the same messages are two runs, not one looping run).

Memory is bounded: fingerprints are kept for the latest history of open conversations only, at most
``max_open`` of them (the oldest is forgotten first), and ``forget`` drops a conversation once its run is judged.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

CONVERSATION_PREFIX = "conversation:"
_MAX_OPEN_CONVERSATIONS = 10_000


class _Conversation:
    """One open conversation (a plain class, not a dataclass, for start-up time: run_rebuilder.py says why)."""

    __slots__ = ("call_points", "prefixes")

    def __init__(self, prefixes: list[bytes]) -> None:
        self.prefixes = prefixes  # the hash of the latest history up to each message: prefixes[i] covers 0..i
        self.call_points: set[int] = set()  # history lengths at which a model call was seen


def prefix_hashes(messages: Sequence[str]) -> list[bytes]:
    """The fingerprint of a history at each point: hash i covers the canonical messages 0..i."""
    hashes: list[bytes] = []
    previous = b""
    for message in messages:
        previous = hashlib.blake2b(previous + message.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        hashes.append(previous)
    return hashes


class ConversationIndex:
    """Which open conversation a model call belongs to, by the fingerprint of its input history."""

    def __init__(self, max_open: int = _MAX_OPEN_CONVERSATIONS) -> None:
        self.max_open = max_open
        self._open: OrderedDict[str, _Conversation] = OrderedDict()  # least recently continued first
        self._owner: dict[bytes, str] = {}  # prefix hash -> the open conversation whose latest history has it

    def __len__(self) -> int:
        return len(self._open)

    def place(self, trace_id: str, messages: Sequence[str]) -> str:
        """The key of the conversation a call with this input history belongs to (a new one keyed by its trace)."""
        hashes = prefix_hashes(messages)
        for point in range(len(hashes) - 1, -1, -1):
            key = self._owner.get(hashes[point])
            if key is None:
                continue
            conversation = self._open[key]
            length = point + 1
            if length == len(hashes) and length not in conversation.call_points:
                conversation.call_points.add(length)  # an earlier call of it, arriving late
                return key
            if length == len(conversation.prefixes) and length < len(hashes):
                self._extend(key, conversation, hashes)
                return key
            break  # a branch, or a second call at one point: a conversation of its own
        key = f"{CONVERSATION_PREFIX}{trace_id}"
        if key in self._open:
            self.forget(key)
        conversation = _Conversation(prefixes=[])
        self._open[key] = conversation
        self._extend(key, conversation, hashes)
        while len(self._open) > self.max_open:
            self.forget(next(iter(self._open)))
        return key

    def forget(self, key: str) -> None:
        """Drop a conversation's fingerprints (its run was judged, or it is the oldest over the cap)."""
        conversation = self._open.pop(key, None)
        if conversation is None:
            return
        for digest in conversation.prefixes:
            if self._owner.get(digest) == key:
                del self._owner[digest]

    def _extend(self, key: str, conversation: _Conversation, hashes: list[bytes]) -> None:
        for digest in hashes[len(conversation.prefixes):]:
            self._owner.setdefault(digest, key)  # a prefix shared with an older branch stays that branch's
        conversation.prefixes = hashes
        conversation.call_points.add(len(hashes))
        self._open.move_to_end(key)
