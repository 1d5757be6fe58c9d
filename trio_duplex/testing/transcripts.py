"""Word error rate, for measuring a recogniser on sentences whose text is known.

A recogniser writes what it hears as text: Whisper adds capitals and punctuation and
writes numbers as digits ("Turn off the light at 9:30 p.m."), where a reference says the
words ("turn off the light at nine thirty pm"). Both sides are normalised the same way
before they are compared, so that only words heard wrong count: lower case, digits said
as words (times as they are said: "9:30" is "nine thirty", "10:05" is "ten oh five",
"10:00" is "ten"), ordinals ("12th" is "twelfth"), "a.m."/"p.m." as "am"/"pm", "%" as
"percent", "&" as "and", hyphens as spaces, and every other mark but a word's own
apostrophe dropped. Nothing else is forgiven: "color" against "colour" is an error, and
so is a name spelled another way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Final

__all__ = ["normalise", "number_words", "word_error_rate", "word_errors"]

_ONES: Final = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen "
    "fourteen fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS: Final = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_ORDINAL: Final = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}


def number_words(n: int) -> str:
    """``n`` (0 to 999,999,999) in words, as said: 730 is "seven hundred thirty"."""
    if n < 0 or n >= 10**9:
        raise ValueError(f"{n} is out of range")
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + ("" if ones == 0 else " " + _ONES[ones])
    for size, name in ((10**6, "million"), (1000, "thousand"), (100, "hundred")):
        if n >= size:
            high, low = divmod(n, size)
            return f"{number_words(high)} {name}" + ("" if low == 0 else f" {number_words(low)}")
    raise AssertionError(n)  # (unreachable: n >= 100 matched "hundred")


def _ordinal(n: int) -> str:
    words = number_words(n).split()
    last = words[-1]
    if last in _ORDINAL:
        words[-1] = _ORDINAL[last]
    elif last.endswith("y"):
        words[-1] = last[:-1] + "ieth"
    else:
        words[-1] = last + "th"
    return " ".join(words)


def _time(hours: str, minutes: str) -> str:
    said = number_words(int(hours))
    if minutes == "00":
        return said
    if minutes.startswith("0"):
        return f"{said} oh {number_words(int(minutes))}"
    return f"{said} {number_words(int(minutes))}"


_MERIDIEM: Final = re.compile(r"\b([ap])\.?\s?m\b\.?")
_CLOCK: Final = re.compile(r"\b(\d{1,2})[:.](\d{2})(?=\s*(?:[ap]m\b|$|[^\d]))")
_ORDINAL_DIGITS: Final = re.compile(r"\b(\d+)(?:st|nd|rd|th)\b")
_DIGITS: Final = re.compile(r"\d+")
_KEPT: Final = re.compile(r"[^a-z0-9' ]+")


def normalise(text: str) -> list[str]:
    """``text``'s words, normalised as the module says."""
    text = text.lower().replace("\u2019", "'").replace("\u2018", "'")
    text = text.replace("%", " percent ").replace("&", " and ")
    text = _MERIDIEM.sub(lambda m: f" {m.group(1)}m ", text)
    text = _CLOCK.sub(lambda m: f" {_time(m.group(1), m.group(2))} ", text)
    text = _ORDINAL_DIGITS.sub(lambda m: f" {_ordinal(int(m.group(1)))} ", text)
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)  # 1,000
    text = _DIGITS.sub(lambda m: f" {number_words(int(m.group()[:9]))} ", text)
    text = _KEPT.sub(" ", text.replace("-", " "))
    return [word.strip("'") for word in text.split() if word.strip("'")]


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(substitutions + deletions + insertions, words in the reference), normalised."""
    ref, hyp = normalise(reference), normalise(hypothesis)
    return _edit_distance(ref, hyp), len(ref)


def word_error_rate(pairs: Iterable[tuple[str, str]]) -> float:
    """The word error rate of (reference, hypothesis) pairs, pooled: all the errors over
    all the reference words (not a mean of per-sentence rates)."""
    errors = words = 0
    for reference, hypothesis in pairs:
        e, n = word_errors(reference, hypothesis)
        errors += e
        words += n
    if words == 0:
        raise ValueError("no reference words")
    return errors / words


def _edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        diagonal, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (x != y))
    return row[-1]
