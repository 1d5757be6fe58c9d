"""trio_duplex.testing.transcripts: the normalisation the word error rate is measured with."""

from __future__ import annotations

import pytest

from trio_duplex.testing.transcripts import (
    normalise,
    number_words,
    word_error_rate,
    word_errors,
)


@pytest.mark.parametrize(
    ("n", "said"),
    [
        (0, "zero"),
        (13, "thirteen"),
        (40, "forty"),
        (42, "forty two"),
        (730, "seven hundred thirty"),
        (1000, "one thousand"),
        (2026, "two thousand twenty six"),
        (1_000_001, "one million one"),
    ],
)
def test_numbers_are_said_as_words(n: int, said: str) -> None:
    assert number_words(n) == said


def test_number_words_refuses_what_it_cannot_say() -> None:
    with pytest.raises(ValueError, match="out of range"):
        number_words(10**9)
    with pytest.raises(ValueError, match="out of range"):
        number_words(-1)


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ("Turn off the light at 9:30 p.m.", "turn off the light at nine thirty pm"),
        ("Wake me at 10:05 a.m.", "wake me at ten oh five am"),
        ("At 10:00.", "at ten"),
        ("Is it on April 12th?", "is it on april twelfth"),
        ("the 21st and the 40th", "the twenty first and the fortieth"),
        (
            "It costs 1,000 dollars, 20% off & more",
            "it costs one thousand dollars twenty percent off and more",
        ),
        ("I\u2019m not home", "i'm not home"),
        ("co-ordinates", "co ordinates"),
        ("'quoted'", "quoted"),
    ],
)
def test_both_sides_are_normalised_alike(written: str, said: str) -> None:
    assert normalise(written) == said.split()


def test_a_word_heard_wrong_is_an_error_and_spelling_is_not_forgiven() -> None:
    assert word_errors("light colour for study room", "Light color for study room.") == (1, 5)
    assert word_errors("turn off the porch light", "Turn off the porch light.") == (0, 5)
    # An insertion, a deletion and a substitution each count once.
    assert word_errors("a b c", "a x c d") == (2, 3)
    assert word_errors("a b c", "") == (3, 3)


def test_the_rate_is_pooled_over_words_not_averaged_over_sentences() -> None:
    pairs = [("a", "b"), ("a b c d e f g h i", "a b c d e f g h i")]
    assert word_error_rate(pairs) == pytest.approx(1 / 10)  # a mean of rates would be 0.5
    with pytest.raises(ValueError, match="no reference words"):
        word_error_rate([("", "anything")])


def test_a_reply_is_judged_said_when_misheard_but_not_when_it_is_another() -> None:
    from tests.speech_audio import judge_reply

    text = "you said: Event Remind or Mona Tuesday put meeting with Powell for tomorrow, 10am."
    # (seen in CI: Piper's random synthesis, misheard by 0.267: still this reply)
    judge_reply(
        text,
        "You said, the vent remind or momentous day put meeting with Powell for tomorrow, 10 a.m.",
    )
    for heard in ("", "you said: wake me up at five am this week"):  # silence; another reply
        with pytest.raises(AssertionError, match="not nearer to it"):
            judge_reply(text, heard)
