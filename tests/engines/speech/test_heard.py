"""What of a cancelled reply the speech engine keeps in its history: the clauses the
client confirmed it began hearing (a phone call's marks), all of it otherwise."""

from __future__ import annotations

from trio_duplex.engines.speech._answer import Response, heard


def reply(cancelled: bool) -> Response:
    response = Response("resp_1", "hello", created=True, cancelled=cancelled)
    response.said = ["You said", " hello.", " And more."]
    response.spoken_at = [5, 9, 0]  # the third clause's audio never went out
    return response


def test_a_cancelled_reply_keeps_the_clauses_whose_audio_was_confirmed() -> None:
    cut = reply(cancelled=True)
    assert heard(cut, 4) == []  # not even the first clause's first frame was confirmed
    assert heard(cut, 5) == ["You said"]  # its first frame was: it began hearing it
    assert heard(cut, 12) == ["You said", " hello."]
    assert heard(cut, 1000) == ["You said", " hello."]  # never spoken: not heard


def test_all_of_it_is_kept_unless_cut_while_the_client_acknowledges() -> None:
    assert heard(reply(cancelled=False), 5) == ["You said", " hello.", " And more."]
    assert heard(reply(cancelled=True), 0) == ["You said", " hello.", " And more."]
    restored = reply(cancelled=True)
    restored.spoken_at = []  # a response restored from a snapshot: not known
    assert heard(restored, 7) == restored.said
