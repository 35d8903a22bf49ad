"""repeated_text: the model repeating itself without a tool call to show for it.

Two shapes:
- the same paragraph in `text_repeat_turns` (3) consecutive turns of a run: what the model wrote beside its tool calls
  and its answer, turn after turn;
- one sentence over and over inside one response (`sentence_repeats`, 5 times or more): a model "chanting" the same
  line as it streams.

Text is compared as prose only (`prose_units`): fenced code, tables, list items, headings, quotes and rules are left
out, since a table row, a bullet or a line of code legitimately repeats; what remains is folded (NFKC, case) with its
whitespace normalised. Numbers stay: "this reservation has 2 passengers" then "... 3 passengers" is an agent going
through a list, not a loop (on the recorded runs, normalising numbers flagged only such walks). Short units say too
little to be a loop ("Let me check.", "Done."): a paragraph counts from `_MIN_PARAGRAPH_CHARS`, a sentence from
`_MIN_SENTENCE_CHARS`.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

from .config import DetectorConfig
from .identity import digest, shorten
from .rule import ClosedTurn, Rule, RunEnd
from .types import REPEATED_TEXT, Anomaly, StreakStart

_MIN_PARAGRAPH_CHARS = 60
_MIN_SENTENCE_CHARS = 24
_MAX_TEXT_CHARS = 100_000  # of a response, the start is read: a chant shows long before that
_FENCE = re.compile(r"^\s*(```|~~~)")
# Lines that are structure, not prose: table rows and rules, list items, headings, quotes, horizontal rules.
_STRUCTURE = re.compile(r"^\s*(\||[-*+•]\s|\d+[.)]\s|#{1,6}\s|>|[-*_=]{3,}\s*$)")
_SENTENCE_END = re.compile(r"(?<=[.!?\u3002\uff01\uff1f])\s+|(?<=[\u3002\uff01\uff1f])")


def prose_units(text: str) -> tuple[list[str], list[str]]:
    """The paragraphs and the sentences of a text's prose, normalised for comparison (see the module's docstring)."""
    paragraphs: list[str] = []
    current: list[str] = []
    in_code = False
    for line in text[:_MAX_TEXT_CHARS].splitlines():
        if _FENCE.match(line):
            in_code = not in_code
            continue
        if in_code or _STRUCTURE.match(line) or not line.strip():
            if current:
                paragraphs.append(" ".join(current))
                current = []
            continue
        current.append(line.strip())
    if current:
        paragraphs.append(" ".join(current))
    normal = [_normal(p) for p in paragraphs]
    sentences = []
    for paragraph, normalised in zip(paragraphs, normal, strict=True):
        parts = _SENTENCE_END.split(paragraph)
        # A paragraph of one sentence is that sentence, already normalised (most of what a model says beside a call).
        sentences += [normalised] if len(parts) == 1 else [_normal(part) for part in parts]
    return ([p for p in normal if len(p) >= _MIN_PARAGRAPH_CHARS],
            [s for s in sentences if len(s) >= _MIN_SENTENCE_CHARS])


def _normal(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


class _Streak:
    __slots__ = ("count", "first_turn", "last_turn", "paragraph", "streak")

    def __init__(self, paragraph: str, turn: int) -> None:
        self.paragraph = paragraph
        self.first_turn = turn
        self.last_turn = turn
        self.count = 1
        self.streak: str | None = None


class RepeatedTextRule(Rule):
    """Follows the paragraphs of the last turn that had text, and counts sentences within each response."""

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self._streaks: dict[str, _Streak] = {}  # the paragraphs of the last turn with text, by their text
        self._last_turn: int | None = None
        self._pending: list[Anomaly] = []  # found in what the model said beside its calls, reported as the turn closes

    def begin_run(self) -> None:
        self._streaks = {}
        self._last_turn = None
        self._pending = []

    def model_said(self, turn: int, text: str) -> None:
        self._pending += self._said(turn, text)

    def end_turn(self, turn: ClosedTurn) -> list[Anomaly]:
        if not self._pending:
            return []
        fired, self._pending = self._pending, []
        return fired

    def end_run(self, end: RunEnd) -> list[Anomaly]:
        fired, self._pending = self._pending, []
        if end.final_text and not end.final_text.isspace():
            fired += self._said(end.turn, end.final_text)
        return fired

    def container_sizes(self) -> dict[str, int]:
        return {"text_streaks": len(self._streaks)}

    def _said(self, turn: int, text: str) -> list[Anomaly]:
        cfg = self.config
        if not cfg.sentence_repeats and not cfg.text_repeat_turns:
            return []
        paragraphs, sentences = prose_units(text)
        fired = []
        if cfg.sentence_repeats and len(sentences) >= cfg.sentence_repeats:  # fewer sentences cannot repeat enough
            counts = Counter(sentences)
            if counts:
                sentence, times = counts.most_common(1)[0]
                if times >= cfg.sentence_repeats:
                    fired.append(self._chant(turn, sentence, times))
        if cfg.text_repeat_turns:
            fired += self._follow(turn, paragraphs)
        return fired

    def _follow(self, turn: int, paragraphs: list[str]) -> list[Anomaly]:
        consecutive = self._last_turn is not None and turn == self._last_turn + 1
        if turn == self._last_turn:  # more text of the same turn (the answer after a pause): merged
            return []
        streaks: dict[str, _Streak] = {}
        firing: list[_Streak] = []
        for paragraph in dict.fromkeys(paragraphs):
            streak = self._streaks.get(paragraph) if consecutive else None
            if streak is None:
                streak = _Streak(paragraph, turn)
            else:
                streak.count += 1
                streak.last_turn = turn
                if streak.count >= self.config.text_repeat_turns:
                    firing.append(streak)
            streaks[paragraph] = streak
        self._streaks = streaks
        self._last_turn = turn
        if not firing:
            return []
        longest = max(firing, key=lambda s: (s.count, len(s.paragraph)))  # one anomaly per turn: the worst
        longest.streak = longest.streak or f"repeated_text:{digest(longest.paragraph)[:10]}@t{longest.first_turn}"
        for streak in firing:
            streak.streak = longest.streak  # paragraphs repeating together are one loop
        said = f": {shorten(longest.paragraph, 160)!r}" if self.config.capture_content else ""
        return [Anomaly(
            type=REPEATED_TEXT, turn=turn, tool=None, arguments=None, call_ids=(), count=longest.count,
            message=(f"The model wrote the same paragraph in {longest.count} consecutive turns (turns "
                     f"{longest.first_turn}-{turn}){said}; it is repeating itself: say something new, act on what "
                     "you have, or tell the user what is blocking you."),
            streak=longest.streak, streak_start=StreakStart(longest.first_turn))]

    def _chant(self, turn: int, sentence: str, times: int) -> Anomaly:
        said = f": {shorten(sentence, 160)!r}" if self.config.capture_content else ""
        return Anomaly(
            type=REPEATED_TEXT, turn=turn, tool=None, arguments=None, call_ids=(), count=times,
            message=(f"One response repeated the same sentence {times} times{said}; the model is looping on its own "
                     "words: stop repeating, and finish the answer or say what is blocking you."),
            streak=f"repeated_text:chant:{digest(sentence)[:10]}@t{turn}", streak_start=StreakStart(turn))
