"""repeated_text: degenerate output, the model repeating itself without a tool call to show for it.

Two shapes:
- the same paragraph in `text_repeat_turns` (3) consecutive turns of a run: what the model wrote beside its tool calls
  and its answer, turn after turn;
- inside one response, a unit (a sentence, a line, a short phrase, or a few of them in turn: "Thinking... Done.")
  repeated back to back `sentence_repeats` (5) times or more: the repeats make up the whole of that stretch. The same
  line restated at intervals across reasoning that varies between ("Result: 0" after each of ten cases, a variable's
  value while tracing code) is not a loop: something else comes between every two of them.

Text is compared as prose only (`prose_units`): fenced code, tables, list items, headings, quotes and rules are left
out, since a table row, a bullet or a line of code legitimately repeats, and each such block breaks a run of
repeats; the text after a closing fence on its line is prose, and read. What remains is folded (NFKC, case) with its
whitespace normalised. Numbers stay: "this reservation has 2 passengers" then "... 3 passengers" is an agent going
through a list, not a loop. A paragraph counts from `_MIN_PARAGRAPH_CHARS`; a chant from `_MIN_CHANT_CHARS` in all,
so that "Done. Done. Done. Done. Done." is one, while a unit without two letters in it never is.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator

from .config import DetectorConfig
from .identity import digest, shorten
from .rule import ClosedTurn, Rule, RunEnd
from .types import REPEATED_TEXT, Anomaly, StreakStart

_MIN_PARAGRAPH_CHARS = 60
_MIN_CHANT_CHARS = 24  # of a whole run of repeats: what a reader would notice as filler
_MAX_CHANT_PERIOD = 4  # units repeating together: "Thinking... Done." is a period of 2
_MAX_UNITS = 20_000  # of a response, the units read: a chant shows long before that
_MAX_TEXT_CHARS = 200_000  # of a response, the start is read
_FENCE = re.compile(r"^\s{0,3}(```+|~~~+)")
# Lines that are structure, not prose: table rows and rules, list items, headings, quotes, horizontal rules.
_STRUCTURE = re.compile(r"^\s*(\||[-*+\u2022]\s|\d+[.)]\s|#{1,6}\s|>|[-*_=]{3,}\s*$)")
# A unit ends after ., !, ?, an ellipsis or their full-width forms, before white space or the end of the line.
_UNIT_END = re.compile(r"(?<=[.!?\u2026\u3002\uff01\uff1f])\s+|(?<=[\u3002\uff01\uff1f])")
_LETTER = re.compile(r"[^\W\d_]")


class _Break:
    """Where structure (code, a table, a list) interrupted the prose: equal to nothing, so no run of repeats spans
    it."""

    __slots__ = ()


def prose_units(text: str) -> tuple[list[str], list[str | _Break]]:
    """The paragraphs of a text's prose (normalised, `_MIN_PARAGRAPH_CHARS` or more), and its units in order
    (sentences, or a line's parts between sentence ends), each structural block between them marked by a break."""
    paragraphs: list[str] = []
    units: list[str | _Break] = []
    current: list[str] = []
    for line in _prose_lines(text[:_MAX_TEXT_CHARS]):
        if line is None:  # structure, a fence or a blank line: the paragraph ends; only structure breaks a run
            if current:
                paragraphs.append(_normal(" ".join(current)))
                current = []
            continue
        if isinstance(line, _Break):
            if current:
                paragraphs.append(_normal(" ".join(current)))
                current = []
            if units and not isinstance(units[-1], _Break):
                units.append(line)
            continue
        current.append(line)
        if len(units) < _MAX_UNITS:
            units += [_normal(part) for part in _UNIT_END.split(line) if part.strip()]
    if current:
        paragraphs.append(_normal(" ".join(current)))
    return [p for p in paragraphs if len(p) >= _MIN_PARAGRAPH_CHARS], units


def _prose_lines(text: str) -> Iterator[str | _Break | None]:
    """Each line of prose (stripped); a break for each block of structure or code; None for a blank line."""
    in_code = False
    for line in text.splitlines():
        fence = _FENCE.match(line)
        if fence:
            if in_code:  # a closing fence: what follows it on the line is prose again
                in_code = False
                rest = line[fence.end():].strip()
                if rest:
                    yield rest
                continue
            in_code = True  # an opening fence: the rest of its line is the code's language
            yield _Break()
            continue
        if in_code:
            continue
        if _STRUCTURE.match(line):
            yield _Break()
        elif not line.strip():
            yield None
        else:
            yield line.strip()


def longest_chant(units: list[str | _Break]) -> tuple[tuple[str, ...], int, int] | None:
    """The longest run of one unit, or a few units in turn, repeated back to back: (the repeated units, rounds,
    characters in the whole run); None when nothing repeats back to back. The shortest period wins a tie."""
    best: tuple[tuple[str, ...], int, int] | None = None
    count = len(units)
    for period in range(1, _MAX_CHANT_PERIOD + 1):
        index = period
        while index < count:
            start = index
            while index < count and _same(units[index], units[index - period]):
                index += 1
            matched = index - start
            if matched >= period:  # at least two rounds
                rounds = (matched + period) // period
                pattern = tuple(str(u) for u in units[start - period:start])
                chars = rounds * sum(len(u) for u in pattern)
                if best is None or rounds > best[1]:
                    best = (pattern, rounds, chars)
            index += 1
    return best


def _same(unit: str | _Break, other: str | _Break) -> bool:
    return unit is other if isinstance(unit, _Break) else unit == other and bool(_LETTER.search(unit))


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
        paragraphs, units = prose_units(text)
        fired = []
        if cfg.sentence_repeats and len(units) >= cfg.sentence_repeats:  # fewer units cannot repeat enough
            chant = longest_chant(units)
            if chant is not None and chant[1] >= cfg.sentence_repeats and chant[2] >= _MIN_CHANT_CHARS:
                fired.append(self._chant(turn, " ".join(chant[0]), chant[1]))
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
            message=(f"One response repeated the same words {times} times back to back{said}; the model is looping "
                     "on its own words: stop repeating, and finish the answer or say what is blocking you."),
            streak=f"repeated_text:chant:{digest(sentence)[:10]}@t{turn}", streak_start=StreakStart(turn))
