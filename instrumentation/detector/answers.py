"""The text structure of what a model says: whether an answer asks, names what a call acted on, quotes or echoes an
error, states an operation as done, or draws on a result.

Judged on structure in any language, never on a list of words: the answer is compared with the failed call, its
error and the results beside it. DESIGN.md has the reasons and the known blind spot.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping

from .identity import safe_text

ANSWER_SCAN_CHARS = 20_000  # of each end of a huge final answer
BATCH_RESULT_CHARS = 20_000  # of each result an answer may draw on
_MIN_MENTION_CHARS = 3  # shorter values ("a", "EU") turn up in any text by chance
_MIN_ECHO_LETTERS = 4  # an error's words shorter than this ("not", "no") are in any text by chance
_ECHO_SLACK = 3  # letters an echoed word may differ by at its end: "fail" echoes "FAILED", "failing" "failure"
# Question marks of the scripts we know: Latin, full-width (CJK), Spanish opening, Arabic. Punctuation, not words.
_QUESTION_MARKS = ("?", "\uff1f", "\u00bf", "\u061f")
_SENTENCE = re.compile(r"[^.!?\n\u3002\uff01\uff1f\u061f]+[.!?\u3002\uff01\uff1f\u061f]?")
_LETTERS = re.compile(r"[^\W\d_]+")
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z])(?=[A-Z])")
_WORD = re.compile(r"\w+")


def answer_addresses(text: str | None, targets: frozenset[str], error_text: str = "") -> bool:
    """Whether a final answer deals with a failed call, judged on structure rather than wording.

    It does when it asks the user something (hands the decision back instead of presenting the work as done), when
    it names what the failed call acted on (one of its targets), or when it repeats the error itself: two words in a
    row of the error message, or a token of it that carries a digit (an id, an amount, a flight number). Nothing
    here is a list of words: the answer is compared with the failed call and its error, in whatever language both
    are written.
    """
    if not text:
        return False
    if len(text) > 2 * ANSWER_SCAN_CHARS:
        text = text[:ANSWER_SCAN_CHARS] + "\n" + text[-ANSWER_SCAN_CHARS:]
    if any(mark in text for mark in _QUESTION_MARKS):
        return True
    folded = fold(text)
    if any(len(t) >= _MIN_MENTION_CHARS and fold(t) in folded for t in targets):
        return True
    return bool(error_text) and not _echo_units(fold(error_text)).isdisjoint(_echo_units(folded))


class FoldedText:
    """Text already folded (`fold`), cut into the units a quote must share on first use and only once: the same text
    (a later call's free text, an answer) is compared with every standing error."""

    __slots__ = ("_units", "_words", "folded")

    def __init__(self, folded: str) -> None:
        self.folded = folded
        self._units: set[str] | None = None
        self._words: dict[str, set[str]] | None = None

    @property
    def units(self) -> set[str]:
        if self._units is None:
            self._units = _echo_units(self.folded)
        return self._units

    @property
    def words(self) -> dict[str, set[str]]:
        """The text's words of four letters or more, by their first four letters (an echo shares at least those)."""
        if self._words is None:
            self._words = {}
            for word in _LETTERS.findall(self.folded):
                if len(word) >= _MIN_ECHO_LETTERS and not any(_is_unspaced_script(c) for c in word):
                    self._words.setdefault(word[:_MIN_ECHO_LETTERS], set()).add(word)
        return self._words


def names_or_quotes(text: FoldedText, targets: frozenset[str], error_text: str) -> bool:
    """Whether the text names one of a failed call's targets or quotes its error."""
    if any(len(t) >= _MIN_MENTION_CHARS and fold(t) in text.folded for t in targets):
        return True
    return bool(error_text) and not _error_units(error_text).isdisjoint(text.units)


@functools.lru_cache(maxsize=256)
def _error_units(error_text: str) -> frozenset[str]:
    """An error's quotable units, worked out once: every later call and answer of the run is compared with them."""
    return frozenset(_echo_units(fold(error_text)))


def echoes_error(text: FoldedText, error_text: str, attempted: str = "") -> bool:
    """Whether the text repeats a word of the error, on its stem: "the tests still fail" after "FAILED test_total",
    "the seat numbers don't match" after "Number of passengers does not match".

    A word counts when it has four letters or more and is not a word of `attempted` (the tool's name and the call's
    arguments): naming what was attempted ("I reserved the projector") is not saying how it went, while a word that
    only the error brought ("fail", "stock", "match", "denied") is the model passing on what the tool said. Like the
    rest of this module it compares the answer with the error, in the error's own words, not with a list of words.
    """
    if not error_text or not text.words:
        return False
    attempted_words = _words_of(attempted)
    for word in (word for same_start in _words_of(error_text).values() for word in same_start):
        if any(_echoes(word, other) for other in attempted_words.get(word[:_MIN_ECHO_LETTERS], ())):
            continue  # a word of the operation or its arguments, repeated by the error
        if any(_echoes(word, other) for other in text.words.get(word[:_MIN_ECHO_LETTERS], ())):
            return True
    return False


def states_operation(text: str, tool: str, error_text: str = "", attempted: str = "") -> bool:
    """Whether a statement in `text` (a sentence without a question mark) names the operation `tool` performs.

    The operation's words are those of the tool's name (`update_reservation_passengers`: update, reservation,
    passengers; camelCase and dotted names split too; words under four letters left out); a sentence names the
    operation when it holds two of them (the one, for a one-word name), each matched on its stem so that "updated"
    and "passenger list" count. This compares the answer with the failed call, not with a list of words.

    Given the call's `error_text` (and `attempted`, see `echoes_error`), a sentence that also echoes the error ("the
    tests still fail" after "FAILED test_total") says how the operation went rather than that it was done, and does
    not count.
    """
    words = _name_words(tool)
    needed = min(2, len(words))
    if not needed:
        return False
    for sentence in _SENTENCE.findall(fold(text[:2 * ANSWER_SCAN_CHARS])):
        if any(mark in sentence for mark in _QUESTION_MARKS):
            continue
        said = set(_LETTERS.findall(sentence))
        if sum(1 for word in words if any(_same_stem(word, other) for other in said)) >= needed:
            if error_text and echoes_error(FoldedText(sentence), error_text, attempted or tool):
                continue
            return True
    return False


def asks_about(text: str, tool: str, targets: frozenset[str]) -> bool:
    """Whether a question in `text` (a sentence with a question mark) names the operation `tool` performs (as
    `states_operation` names it) or one of the failed call's targets: the answer hands that decision back."""
    words = _name_words(tool)
    needed = min(2, len(words))
    folded_targets = [fold(t) for t in targets if len(t) >= _MIN_MENTION_CHARS]
    for sentence in _SENTENCE.findall(fold(text[:2 * ANSWER_SCAN_CHARS])):
        if not any(mark in sentence for mark in _QUESTION_MARKS):
            continue
        if any(t in sentence for t in folded_targets):
            return True
        said = set(_LETTERS.findall(sentence))
        if needed and sum(1 for word in words if any(_same_stem(word, other) for other in said)) >= needed:
            return True
    return False


def draws_on(text: str, results: Iterable[object]) -> bool:
    """Whether an answer repeats something distinctive from the given results: a token with a digit in it (an id, a
    flight number, an amount, a date) that the result holds too."""
    answer = {unit for unit in _echo_units(fold(text[:2 * ANSWER_SCAN_CHARS])) if " " not in unit}
    if not answer:
        return False
    return any(not answer.isdisjoint(_echo_units(fold(safe_text(result)[:BATCH_RESULT_CHARS])))
               for result in results)


def free_text_in(arguments: object) -> str:
    """The free text among a call's arguments (strings with spaces in them: a summary, a message), folded and cut.

    An id argument naming the same order is the next operation on it, not a report, so only free text counts.
    """
    return fold(" ".join(t for t in _strings_in(arguments) if any(c.isspace() for c in t.strip())))[:ANSWER_SCAN_CHARS]


def fold(text: str) -> str:
    """Text as it is compared: NFKC, then case-folded."""
    return unicodedata.normalize("NFKC", text).casefold()


def _name_words(tool: str) -> list[str]:
    spaced = _CAMEL_BOUNDARY.sub(" ", tool)
    return [word for word in _LETTERS.findall(fold(spaced)) if len(word) >= 4]


def _words_of(text: str) -> dict[str, set[str]]:
    """The words of four letters or more of a tool's name, arguments or error (camelCase split), by their first four
    letters."""
    words: dict[str, set[str]] = {}
    for word in _LETTERS.findall(fold(_CAMEL_BOUNDARY.sub(" ", text))):
        if len(word) >= _MIN_ECHO_LETTERS and not any(_is_unspaced_script(c) for c in word):
            words.setdefault(word[:_MIN_ECHO_LETTERS], set()).add(word)
    return words


def _echoes(word: str, other: str) -> bool:
    """A word echoes another when they agree on four letters at least and differ only in their last three: stricter
    than `_same_stem` ("passed" does not echo "passengers"), since a chance echo would keep a false claim quiet."""
    shorter = min(len(word), len(other))
    shared = next((i for i in range(shorter) if word[i] != other[i]), shorter)
    return shared >= _MIN_ECHO_LETTERS and shared >= max(len(word), len(other)) - _ECHO_SLACK


def _same_stem(word: str, other: str) -> bool:
    """Two words share a stem when they agree on all but their last two letters, and on four letters at least."""
    shorter = min(len(word), len(other))
    shared = next((i for i in range(shorter) if word[i] != other[i]), shorter)
    return shared >= 4 and shared >= shorter - 2


def _strings_in(value: object, depth: int = 0) -> Iterator[str]:
    """Every string in a JSON-like value (arguments given as JSON text are parsed), to a bounded depth."""
    if depth > 8:
        return
    if isinstance(value, str):
        if depth == 0 and value[:1] in "{[":
            try:
                parsed = json.loads(value)
            except (ValueError, RecursionError):
                yield value
                return
            yield from _strings_in(parsed, depth + 1)
            return
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings_in(item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings_in(item, depth + 1)


def _echo_units(folded: str) -> set[str]:
    """Pieces of text distinctive enough that sharing one means quoting: word pairs, tokens with a digit, and for
    scripts written without spaces (CJK) runs of three characters."""
    words = _WORD.findall(folded)
    units = {f"{a} {b}" for a, b in itertools.pairwise(words)}
    for word in words:
        if len(word) >= 3 and any(c.isdigit() for c in word):
            units.add(word)
        if len(word) >= 3 and any(_is_unspaced_script(c) for c in word):
            units.update(word[i:i + 3] for i in range(len(word) - 2))
    return units


def _is_unspaced_script(char: str) -> bool:
    return "\u3040" <= char <= "\u30ff" or "\u3400" <= char <= "\u9fff" or "\uac00" <= char <= "\ud7af"
