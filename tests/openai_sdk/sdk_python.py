"""The official Python SDK (``openai[realtime]``, unchanged) holds conversations with a
``trio-duplex serve`` over ``/v1/realtime``.

Run in the venv of ``requirements.txt``, never the project's (of the tests it imports
only ``sdk_shared.py``), from the repository's root: ``python -m tests.openai_sdk.sdk_python
--base-url http://H:P/v1 --voice-url http://H:P2/v1 --speech-url http://H:P3/v1
--speech-audio PCM --speech-sentences DIR --api-key K [SCENARIO ...]``
(the echo, voice and speech engines' servers). Every event is read with the connection's
own ``recv()`` (the SDK's models) and also validated by the SDK's pydantic union,
strictly. Prints one JSON object, scenario →
what it saw (or ``{"crash": traceback}``), which ``test_python_sdk.py`` asserts on.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic
from openai import APIStatusError, AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection
from openai.types.realtime import RealtimeServerEvent
from openai.types.realtime.realtime_audio_formats_param import AudioPCM as AudioPCMParam
from websockets.exceptions import ConnectionClosed

from tests.openai_sdk.sdk_shared import LONG_TEXT, TIMEOUT, cli, pcm16, run_scenarios, sha

STRICT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RealtimeServerEvent)
TEXT = "hello from the python sdk"


class Reader:
    """Reads a connection's events, recording each (its type, the SDK's model class, and
    whether the SDK's union validates it)."""

    def __init__(self, conn: AsyncRealtimeConnection) -> None:
        self.conn = conn
        self.types: list[str] = []
        self.classes: list[str] = []
        self.invalid: list[str] = []
        self.event_ids: list[str | None] = []
        self.errors: list[dict[str, Any]] = []

    async def next(self) -> Any:
        try:
            event = await asyncio.wait_for(self.conn.recv(), TIMEOUT)
        except ConnectionClosed as exc:  # say what the server said before it closed
            raise RuntimeError(f"{exc!r} after the errors {self.errors}") from exc
        if event.type == "error":
            self.errors.append(event.error.to_dict())
        self.types.append(event.type)
        self.classes.append(type(event).__name__)
        self.event_ids.append(getattr(event, "event_id", None))
        try:
            STRICT.validate_python(event.to_dict())
        except pydantic.ValidationError as exc:
            self.invalid.append(f"{event.type}: {exc}")
        return event

    async def until(self, kind: str) -> list[Any]:
        """The events up to and including the next one of type ``kind``."""
        events = []
        while True:
            event = await self.next()
            events.append(event)
            if event.type == kind:
                return events

    def record(self) -> dict[str, Any]:
        return {
            "types": self.types,
            "classes": self.classes,
            "invalid": self.invalid,
            "event_ids": self.event_ids,
        }


def turn_summary(events: list[Any]) -> dict[str, Any]:
    """What one response carried: its text, transcript and audio, ids and end."""
    created = [e for e in events if e.type == "response.created"]
    done = [e for e in events if e.type == "response.done"]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    transcript = "".join(
        e.delta for e in events if e.type == "response.output_audio_transcript.delta"
    )
    audio = b"".join(
        base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
    )
    response_ids = sorted({e.response_id for e in events if hasattr(e, "response_id")})
    summary: dict[str, Any] = {
        "types": [e.type for e in events],
        "text": text,
        "transcript": transcript,
        "audio_bytes": len(audio),
        "audio_sha": sha(audio),
        "response_ids": response_ids,
        "created_id": created[0].response.id if created else None,
        "created_status": created[0].response.status if created else None,
    }
    for e in events:
        if e.type == "response.output_text.done":
            summary["text_done"] = e.text
        if e.type == "response.output_audio_transcript.done":
            summary["transcript_done"] = e.transcript
    if done:
        response = done[-1].response
        summary["done_id"] = response.id
        summary["status"] = response.status
        summary["output"] = [item.to_dict() for item in (response.output or [])]
    return summary


async def session_scenario(args: argparse.Namespace) -> dict[str, Any]:
    client = AsyncOpenAI(api_key=args.api_key, base_url=args.base_url, max_retries=0)
    async with client.realtime.connect(model="gpt-realtime-test") as conn:
        events = aiter(conn)  # the connection's async iteration, this once
        created: Any = await asyncio.wait_for(anext(events), TIMEOUT)
        session = created.session
        return {
            "types": [created.type],
            "classes": [type(created).__name__],
            "event_ids": [created.event_id],
            "session_class": type(session).__name__,
            "session": session.to_dict(),
            "extension_keys": sorted(set(created.to_dict()) - {"type", "event_id", "session"}),
        }


async def _text_only(conn: AsyncRealtimeConnection, reader: Reader) -> Any:
    await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
    return (await reader.until("session.updated"))[-1]


async def _text_turn(conn: AsyncRealtimeConnection, reader: Reader, text: str) -> list[Any]:
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    await conn.response.create()
    return await reader.until("response.done")


async def text_scenario(args: argparse.Namespace) -> dict[str, Any]:
    client = AsyncOpenAI(api_key=args.api_key, base_url=args.base_url, max_retries=0)
    async with client.realtime.connect(model="gpt-realtime-test") as conn:
        reader = Reader(conn)
        await reader.until("session.created")
        updated = await _text_only(conn, reader)
        events = await _text_turn(conn, reader, TEXT)
        user_items = [
            e.item.to_dict()
            for e in events
            if e.type == "conversation.item.added" and e.item.role == "user"
        ]
        return {
            **reader.record(),
            "updated_modalities": updated.session.output_modalities,
            "user_items": user_items,
            "turn": turn_summary(events),
        }


async def audio_scenario(args: argparse.Namespace) -> dict[str, Any]:
    client = AsyncOpenAI(api_key=args.api_key, base_url=args.base_url, max_retries=0)
    sent = pcm16(300)
    async with client.realtime.connect(model="gpt-realtime-test") as conn:
        reader = Reader(conn)
        await reader.until("session.created")
        pcm: AudioPCMParam = {"type": "audio/pcm", "rate": 24000}
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["audio"],
                "audio": {"input": {"format": pcm}, "output": {"format": pcm}},
            }
        )
        updated = (await reader.until("session.updated"))[-1]
        for start in range(0, len(sent), 4800):  # 100 ms a chunk
            await conn.input_audio_buffer.append(
                audio=base64.b64encode(sent[start : start + 4800]).decode()
            )
        await conn.input_audio_buffer.commit()
        committed = (await reader.until("input_audio_buffer.committed"))[-1]
        await conn.response.create()
        events = await reader.until("response.done")
        audio = updated.session.audio
        return {
            **reader.record(),
            "formats": [audio.input.format.to_dict(), audio.output.format.to_dict()],
            "committed_item_id": committed.item_id,
            "sent_bytes": len(sent),
            "sent_sha": sha(sent),
            "turn": turn_summary(events),
        }


async def speech_scenario(args: argparse.Namespace) -> dict[str, Any]:
    """A spoken sentence (24 kHz PCM16 from ``--speech-audio``) to the speech engine, with
    server-side turn detection: it hears the turn, transcribes it and answers aloud."""
    client = AsyncOpenAI(api_key=args.api_key, base_url=args.speech_url, max_retries=0)
    sent: bytes = args.speech_pcm
    async with client.realtime.connect(model="gpt-realtime-test") as conn:
        reader = Reader(conn)
        await reader.until("session.created")
        pcm: AudioPCMParam = {"type": "audio/pcm", "rate": 24000}
        await conn.session.update(
            session={
                "type": "realtime",
                "audio": {
                    "input": {"format": pcm, "turn_detection": {"type": "server_vad"}},
                    "output": {"format": pcm},
                },
            }
        )
        await reader.until("session.updated")
        for start in range(0, len(sent), 960):  # 20 ms a chunk, sent as fast as it goes
            await conn.input_audio_buffer.append(
                audio=base64.b64encode(sent[start : start + 960]).decode()
            )
        heard = await reader.until("conversation.item.input_audio_transcription.completed")
        events = await reader.until("response.done")
        turn = turn_summary(events)
        audio = b"".join(
            base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
        )
        return {
            "answer": base64.b64encode(audio).decode(),
            **reader.record(),
            "heard_types": [e.type for e in heard],
            "transcript": heard[-1].transcript,
            "turn": turn,
        }


async def speech_sentences_scenario(args: argparse.Namespace) -> dict[str, Any]:
    """Sentences (``--speech-sentences``) to the speech engine, whose turn detection
    announces and transcribes each without answering (``create_response: false``): each
    sent as fast as it goes once the turns before it have their transcripts (a client
    sending faster than the recogniser hears would be refused with input_backpressure);
    then a ``response.create`` answers the last, aloud."""
    client = AsyncOpenAI(api_key=args.api_key, base_url=args.speech_url, max_retries=0)
    async with client.realtime.connect(model="gpt-realtime-test") as conn:
        reader = Reader(conn)
        await reader.until("session.created")
        await conn.session.update(
            session={
                "type": "realtime",
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "create_response": False}}
                },
            }
        )
        await reader.until("session.updated")
        heard: list[Any] = []
        started = completed = 0
        for sent in args.sentences_pcm:
            for start in range(0, len(sent), 960):  # 20 ms a chunk
                await conn.input_audio_buffer.append(
                    audio=base64.b64encode(sent[start : start + 960]).decode()
                )
            before = started
            while started == before or completed < started:
                event = await reader.next()
                heard.append(event)
                if event.type == "input_audio_buffer.speech_started":
                    started += 1
                elif event.type.startswith("conversation.item.input_audio_transcription."):
                    completed += event.type != "conversation.item.input_audio_transcription.delta"
        await conn.response.create()
        events = await reader.until("response.done")
        audio = b"".join(
            base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
        )
        done = "conversation.item.input_audio_transcription.completed"
        return {
            "answer": base64.b64encode(audio).decode(),
            **reader.record(),
            "heard_types": [e.type for e in heard],
            "transcripts": [e.transcript for e in heard if e.type == done],
            "turn": turn_summary(events),
        }


async def cancel_scenario(args: argparse.Namespace) -> dict[str, Any]:
    client = AsyncOpenAI(api_key=args.api_key, base_url=args.voice_url, max_retries=0)
    async with client.realtime.connect(model="gpt-realtime-test") as conn:
        reader = Reader(conn)
        await reader.until("session.created")
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": LONG_TEXT}],
            }
        )
        await conn.response.create()
        before = await reader.until("response.output_audio.delta")
        await conn.response.cancel()
        rest = await reader.until("response.done")
        # Nothing of the cancelled response comes after its end: a session.update's
        # answer is the very next event.
        await conn.session.update(session={"type": "realtime", "instructions": "after"})
        after = await reader.until("session.updated")
        return {
            **reader.record(),
            "turn": turn_summary(before + rest),
            "after": [e.type for e in after],
        }


async def error_scenario(args: argparse.Namespace) -> dict[str, Any]:
    client = AsyncOpenAI(api_key=args.api_key, base_url=args.base_url, max_retries=0)
    async with client.realtime.connect(model="gpt-realtime-test") as conn:
        reader = Reader(conn)
        await reader.until("session.created")
        errors = []
        for bad in (
            {"type": "no.such.event", "event_id": "evt_unknown_1"},
            {"type": "input_audio_buffer.append", "audio": "@@ not base64 @@", "event_id": "e2"},
        ):
            await conn.send(bad)  # type: ignore[arg-type]  # a bad event on purpose
            error = await reader.next()
            errors.append(
                {
                    "type": error.type,
                    "class": type(error).__name__,
                    "error_class": type(error.error).__name__,
                    "error": error.error.to_dict(),
                }
            )
        await _text_only(conn, reader)
        events = await _text_turn(conn, reader, "still here")
        return {**reader.record(), "errors": errors, "turn": turn_summary(events)}


async def client_secret_scenario(args: argparse.Namespace) -> dict[str, Any]:
    client = AsyncOpenAI(api_key=args.api_key, base_url=args.base_url, max_retries=0)
    secret = await client.realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 600},
        session={"type": "realtime", "instructions": "be brief", "output_modalities": ["text"]},
    )
    record: dict[str, Any] = {
        "class": type(secret).__name__,
        "session_class": type(secret.session).__name__,
        "session": secret.session.to_dict(),
        "expires_in": secret.expires_at - int(time.time()),
        "value_is_str": isinstance(secret.value, str) and len(secret.value) >= 16,
        "value_is_not_the_key": secret.value != args.api_key,
    }
    ephemeral = AsyncOpenAI(api_key=secret.value, base_url=args.base_url, max_retries=0)
    try:  # (its own failure, so that the secret's issue is judged on its own)
        async with ephemeral.realtime.connect(model="gpt-realtime-test") as conn:
            reader = Reader(conn)
            created = (await reader.until("session.created"))[-1]
            record["created_session"] = created.session.to_dict()
            events = await _text_turn(conn, reader, "secret turn")
            record.update(reader.record())
            record["turn"] = turn_summary(events)
    except Exception:
        record["connect_crash"] = traceback.format_exc()
    record["reused"] = await _refusal(ephemeral)
    record["wrong_key"] = await _refusal(
        AsyncOpenAI(api_key="sk-not-a-key", base_url=args.base_url, max_retries=0)
    )
    try:
        await AsyncOpenAI(
            api_key="sk-not-a-key", base_url=args.base_url, max_retries=0
        ).realtime.client_secrets.create(session={"type": "realtime"})
        record["secret_with_wrong_key"] = None
    except APIStatusError as exc:
        record["secret_with_wrong_key"] = [type(exc).__name__, exc.status_code]
    return record


async def _refusal(client: AsyncOpenAI) -> list[Any]:
    """How a connect is refused: the exception's class, and its HTTP status if any."""
    try:
        async with client.realtime.connect(model="gpt-realtime-test") as conn:
            event = await asyncio.wait_for(conn.recv(), TIMEOUT)
            return ["accepted", event.type]
    except Exception as exc:
        response = getattr(exc, "response", None)
        return [type(exc).__name__, getattr(response, "status_code", None)]


SCENARIOS: dict[str, Callable[[argparse.Namespace], Awaitable[dict[str, Any]]]] = {
    "session": session_scenario,
    "text": text_scenario,
    "audio_echo": audio_scenario,
    "audio_speech": speech_scenario,
    "speech_sentences": speech_sentences_scenario,
    "cancel": cancel_scenario,
    "error": error_scenario,
    "client_secret": client_secret_scenario,
}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    return await run_scenarios(args.scenarios, lambda name: SCENARIOS[name](args))


if __name__ == "__main__":
    cli(__doc__, SCENARIOS, run)
