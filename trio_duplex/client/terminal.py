"""``trio-duplex connect URL [URL ...]``: an interactive terminal client, also driven from
a pipe. Several URLs are the nodes of one cluster (``connect``'s policy picks among them).

Each line read from stdin is sent as a text turn: ``input.text.append {text}``, or with
``--dialect openai`` (``/v1/realtime``) ``conversation.item.create`` then
``response.create`` (a line ``/event JSON`` sends that event as it is). Server events
are printed to stdout as they arrive, one per line (``--json``: the raw event); the
connection's story (connected, lost, retrying, resumed) goes to stderr. At end of
input the client waits until the server has read everything and the output has been
quiet for ``--linger`` seconds, then closes the session. Ctrl-C closes the session
cleanly; a second Ctrl-C detaches and prints how to resume.

``--mic FILE.wav`` streams the file as the microphone (see ``mic.py``) beside the typed
lines; ``--speaker OUT.wav`` (also spelt ``--save-audio``) writes the audio received.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import signal
import ssl
import sys
import urllib.parse
import wave
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, TextIO

import attrs
import trio

from ..audio import FORMATS, AudioError, AudioFormat, Decoder
from ..core.events import DEFAULT_PATH, TERMINAL_EVENTS, EventType, Reason
from . import (
    Attached,
    ClientError,
    ClientOptions,
    ClientSession,
    ConnectionChange,
    Disconnected,
    ReconnectFailed,
    ReconnectPolicy,
    ResumeState,
    Retrying,
    StreamFactories,
    connect,
)
from .dialect import DIALECTS, NATIVE, ClientDialect, dialect_named, text_of
from .mic import FRAME_SECONDS, TAIL_SILENCE_S, MicError, Microphone, open_wav, stream
from .transport import audio_bytes
from .urls import parse_urls

TOKEN_ENV = "TRIO_DUPLEX_RESUME_TOKEN"
API_KEY_VARIABLE = "TRIO_DUPLEX_API_KEY"
"""Where `trio-duplex connect` takes an API key from (servers with --api-key-file)."""
_V1_AUDIO = AudioFormat("pcm16", 24_000)
"""Received audio's format when the session negotiated none (v1: the voice engine's)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trio-duplex connect",
        description="Interactive client: lines in, events out. Ctrl-C closes the session, "
        "a second Ctrl-C detaches.",
    )
    _add_session_arguments(p)
    _add_audio_arguments(p)
    _add_lifetime_arguments(p)
    return p


def _add_session_arguments(p: argparse.ArgumentParser) -> None:
    """Where to connect, which session, and how its events print."""
    p.add_argument(
        "url",
        metavar="URL",
        nargs="+",
        help=f"ws://HOST:PORT{DEFAULT_PATH} or wss://... (path optional: the dialect's); "
        "several: the "
        "nodes of one cluster, all ws:// or all wss://: the first connection goes to a "
        "random one, a failed attempt to the next, and a session a draining node migrates "
        "is resumed on another",
    )
    p.add_argument(
        "--ca",
        metavar="FILE",
        help="trust the server certificates this PEM file signs (wss://; default: the system's)",
    )
    p.add_argument(
        "--dialect",
        choices=sorted(DIALECTS),
        default="native",
        help=f"the wire: native ({DEFAULT_PATH}) or openai (OpenAI Realtime events with "
        "resume, /v1/realtime; --session is then an OpenAI session object) (native)",
    )
    p.add_argument("--json", action="store_true", help="print each event as raw JSON")
    p.add_argument("--session", metavar="JSON", default="{}", help="configuration of a new session")
    p.add_argument("--resume", metavar="SESSION_ID", help="resume this session instead")
    p.add_argument("--token", help=f"its resume token (or set ${TOKEN_ENV})")
    p.add_argument(
        "--last-seq",
        type=int,
        default=0,
        metavar="N",
        help="last server_event_seq already seen, for --resume (0)",
    )


def _add_audio_arguments(p: argparse.ArgumentParser) -> None:
    """The microphone, the speaker, and the audio's lane and format."""
    p.add_argument(
        "--save-audio",
        "--speaker",
        dest="save_audio",
        metavar="PATH",
        help="write received audio (response.output_audio.delta) to a WAV file "
        "(PCM16 at the negotiated output rate; G.711 and Opus are decoded)",
    )
    p.add_argument(
        "--mic",
        metavar="FILE.wav",
        help="a PCM16 WAV file (mono or stereo, any rate) as the microphone: streamed in "
        "real time as input audio (on the binary lane unless --audio-wire json), then "
        f"{TAIL_SILENCE_S:g} s of silence; end of input waits for it",
    )
    p.add_argument(
        "--audio-wire",
        choices=["json", "binary"],
        help="the lane audio travels on: base64 in JSON (v1) or binary messages",
    )
    p.add_argument(
        "--audio-format",
        choices=FORMATS,
        help="the audio format both ways (the server converts for its engine)",
    )
    p.add_argument(
        "--audio-rate",
        type=int,
        metavar="HZ",
        help="the audio's sample rate both ways (default: the format's own)",
    )


def _add_lifetime_arguments(p: argparse.ArgumentParser) -> None:
    """Colour, how long to linger at end of input, and how hard to reconnect."""
    p.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    p.add_argument(
        "--linger",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="at end of input, close once output has been quiet this long (1)",
    )
    p.add_argument(
        "--max-attempts",
        type=int,
        default=10,
        metavar="N",
        help="reconnection attempts per outage (10)",
    )
    p.add_argument(
        "--reconnect-deadline",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="give up reconnecting after this long (30)",
    )


@attrs.define(eq=False)
class Printer:
    """Events to ``out``, the connection's story to ``err``; colour when asked."""

    out: TextIO
    err: TextIO
    raw_json: bool = False
    color: bool = False
    dialect: ClientDialect = NATIVE

    def _paint(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def event(self, event: dict[str, Any]) -> None:
        if self.raw_json:
            field = self.dialect.output_audio_field
            if isinstance(event.get(field), bytes):  # the binary lane: shown as in JSON
                event = {**event, field: base64.b64encode(event[field]).decode("ascii")}
            self.out.write(json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n")
        else:
            self.out.write(self._compact(event) + "\n")
        self.out.flush()

    def _compact(self, event: dict[str, Any]) -> str:
        kind = str(event.get("type"))
        seq = event.get("server_event_seq")
        rest = {k: v for k, v in event.items() if k not in ("type", "server_event_seq")}
        head = self._paint("2", f"{seq:>5}" if seq is not None else "    -")
        if kind == EventType.ERROR:
            said = self.dialect.error(event)
            event_id = said.get("event_id")  # the client event's own id, if it had one
            where = f" (event_id={event_id})" if event_id is not None else ""
            body = f"{said.get('code')}: {said.get('message')}{where}"
            return f"{head} {self._paint('1;31', kind)} {self._paint('31', body)}"
        field = self.dialect.output_audio_field
        if kind.endswith("output_audio.delta") and isinstance(rest.get(field), str | bytes):
            audio = rest.pop(field)
            if isinstance(audio, bytes):
                size = len(audio)
            else:  # base64: 3 bytes per 4 characters, less its padding
                size = len(audio) * 3 // 4 - audio[-2:].count("=")
            rest[field] = f"<{size} bytes>"
            rest.pop("binary", None)
        text = text_of(event)
        if text is not None:
            rest.pop("text" if "text" in rest else "delta", None)
        fields = " ".join(f"{k}={_short(v)}" for k, v in rest.items())
        painted = self._paint("33" if kind.startswith("session.") else "36", kind)
        shown = f" {self._paint('1', text)}" if isinstance(text, str) else ""
        return f"{head} {painted}{shown}{' ' + self._paint('2', fields) if fields else ''}"

    def status(self, text: str) -> None:
        self.err.write(self._paint("35", f"* {text}") + "\n")
        self.err.flush()

    def change(self, change: ConnectionChange) -> None:
        if isinstance(change, Attached):
            if self.raw_json and change.event:  # the raw stream starts with created/resumed
                self.event(change.event)
            if change.resumed:
                self.status(
                    f"resumed session {change.session_id} (generation "
                    f"{change.generation}, resending {change.resent} events)"
                )
            else:
                self.status(f"connected: session {change.session_id}")
        elif isinstance(change, Disconnected):
            self.status(f"connection lost ({change.reason}); reconnecting")
        elif isinstance(change, Retrying):
            self.status(f"retry {change.attempt} in {change.delay:.2f}s ({change.error})")


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class AudioSink:
    """Received audio, decoded to PCM16 and appended to a WAV file (the header is fixed
    up on close). Its format is the session's negotiated output format, known once the
    first audio arrives."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.bytes = 0
        self.bad_frames = 0
        self._decoder: Decoder | None = None
        # Opened here, not by wave.open(path): its half-built writer, left by a path that
        # cannot be opened, complains again when collected.
        self._file = open(path, "wb")
        self._wav = wave.open(self._file, "wb")
        self._wav.setnchannels(1)
        self._wav.setsampwidth(2)
        self._wav.setframerate(_V1_AUDIO.rate)

    def add(
        self, event: Mapping[str, Any], config: Mapping[str, Any], dialect: ClientDialect = NATIVE
    ) -> None:
        """Add one ``response.output_audio.delta`` of a session configured ``config``."""
        if self._decoder is None:
            wire = _wire_format(config, "output", dialect)
            self._wav.setframerate(wire.rate)
            self._decoder = Decoder(wire, wire.rate)  # to PCM16, at its own rate
        payload = audio_bytes(event)
        try:
            if payload is None:
                raise AudioError("not base64")
            pcm = self._decoder.decode(payload)
        except AudioError:
            self.bad_frames += 1
            return
        self._wav.writeframes(pcm)
        self.bytes += len(pcm)

    def close(self) -> None:
        self._wav.close()  # fixes up the header; the file is ours to close
        self._file.close()


def _wire_format(
    config: Mapping[str, Any], side: str, dialect: ClientDialect = NATIVE
) -> AudioFormat:
    """The session's audio ``side`` ("input" or "output") as the server granted it."""
    granted = dialect.audio_format(config, side)
    if granted is not None and granted[0] in FORMATS:
        return AudioFormat(*granted)
    return _V1_AUDIO


def _audio_request(args: argparse.Namespace) -> dict[str, Any]:
    """``session.audio`` from ``--audio-wire/-format/-rate`` (empty: none given)."""
    wire = args.audio_wire
    if wire is None and args.mic is not None:  # a microphone's audio goes on the binary lane
        wire = "binary"
    return dialect_named(args.dialect).audio_request(wire, args.audio_format, args.audio_rate)


@attrs.define(eq=False)
class _Run:
    """One run of the client: its session, output and how it is ending."""

    args: argparse.Namespace
    printer: Printer
    audio: AudioSink | None = None
    mic: Microphone | None = None
    mic_done: trio.Event = attrs.field(factory=trio.Event)
    interrupts: int = 0
    exit_code: int = 0
    quiet: trio.CancelScope | None = None
    done: trio.Event = attrs.field(factory=trio.Event)

    async def show_events(self, session: ClientSession) -> None:
        try:
            async for event in session:
                self.printer.event(event)
                if self.quiet is not None:
                    self.quiet.deadline = trio.current_time() + self.args.linger
                kind = event.get("type")
                if self.audio is not None and kind == "response.output_audio.delta":
                    self.audio.add(event, session.config, session.dialect)
                if kind == EventType.EXPIRED or event.get("reason") == Reason.ENGINE_ERROR:
                    self.exit_code = 1
                if kind in TERMINAL_EVENTS:
                    self.printer.status(f"session ended: {kind} ({event.get('reason')})")
        except ClientError as exc:
            self.printer.status(f"session failed: {exc}")
            self.exit_code = 1
        self.done.set()

    async def feed(self, session: ClientSession, lines: trio.MemoryReceiveChannel[str]) -> None:
        try:
            async for line in lines:
                line = line.rstrip("\r\n")
                if not line.strip():
                    continue
                try:
                    for event in _events_for(line, session.dialect):
                        await session.send(event)
                except ValueError as exc:  # EventTooLarge is one
                    self.printer.status(f"not sent: {exc}")
            # End of input (and of the microphone's file): let the server read it all
            # and the answers come, then close.
            await self.mic_done.wait()
            await session.confirm()
            # Linger: a deadline that every printed event pushes back.
            with trio.CancelScope(deadline=trio.current_time() + self.args.linger) as self.quiet:
                await trio.sleep_forever()
            if self.interrupts == 0:
                self.printer.status("end of input: closing the session")
                await session.aclose()
        except ClientError:
            return  # the session ended or failed: show_events reports it

    async def speak(self, session: ClientSession) -> None:
        """Stream ``--mic``'s file as the session's input audio, in real time."""
        mic = self.mic
        if mic is None:
            self.mic_done.set()
            return
        try:
            wire = _wire_format(session.config, "input", session.dialect)
            self.printer.status(
                f"mic: streaming {mic.path} ({mic.seconds:.2f} s, {mic.rate} Hz "
                f"{'stereo' if mic.channels == 2 else 'mono'}) as {wire.format} at {wire.rate} Hz"
            )
            sent = await stream(mic.payloads(wire), session.send_audio)
            self.printer.status(
                f"mic: end of {mic.path} ({sent * FRAME_SECONDS:.2f} s sent, "
                f"the last {TAIL_SILENCE_S:g} s silence)"
            )
        except ClientError:
            return  # the session ended or failed: show_events reports it
        except (OSError, EOFError, wave.Error) as exc:  # the file changed since it was checked
            self.printer.status(f"mic: cannot read {mic.path} any further: {exc}")
        finally:
            self.mic_done.set()

    async def watch(
        self,
        session: ClientSession,
        interrupts: trio.MemoryReceiveChannel[int],
        nursery: trio.Nursery,
    ) -> None:
        async for _ in interrupts:
            self.interrupts += 1
            if self.interrupts == 1:
                self.printer.status("closing the session (Ctrl-C again to detach)")
                nursery.start_soon(session.aclose)  # output goes on until session.closed
            else:
                state = await session.detach()  # counts what arrived while detaching
                self._show_resume(session, state)
                self.done.set()
                return

    def _show_resume(self, session: ClientSession, state: ResumeState) -> None:
        grace = session.limits.disconnect_grace_s
        dialect = "" if session.dialect is NATIVE else f" --dialect {session.dialect.name}"
        self.printer.status(
            f"detached. Resume within {grace:g}s with:\n  trio-duplex connect{dialect} "
            f"{' '.join(self.args.url)} --resume {state.session_id} --token={state.resume_token} "
            f"--last-seq {state.last_server_event_seq}"
        )


def _events_for(line: str, dialect: ClientDialect) -> list[dict[str, Any]]:
    if line.startswith("/event "):
        try:
            event = json.loads(line[len("/event ") :])
        except ValueError:
            raise ValueError("/event needs a JSON object") from None
        if not isinstance(event, dict):
            raise ValueError("/event needs a JSON object")
        return [event]
    return dialect.text_turn(line)


def _full_url(url: str, dialect: ClientDialect = NATIVE) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.path in ("", "/"):
        parts = parts._replace(path=dialect.path)
    return urllib.parse.urlunsplit(parts)


class _Refused(Exception):
    """A flag that cannot be used: said on stderr, and the exit code is 2."""


@attrs.frozen
class _Opening:
    """What ``run`` connects with, from the flags, all checked."""

    urls: tuple[str, ...]
    config: dict[str, Any] | None  # a new session's configuration (None: resume)
    resume: ResumeState | None
    options: ClientOptions
    ssl_context: ssl.SSLContext | None
    dialect: ClientDialect = NATIVE


async def run(
    args: argparse.Namespace,
    *,
    lines: trio.MemoryReceiveChannel[str],
    interrupts: trio.MemoryReceiveChannel[int],
    printer: Printer,
    open_stream: StreamFactories | None = None,
    rng: random.Random | None = None,
) -> int:
    """The client, with its input, Ctrl-C presses and output passed in (tests drive it)."""
    try:
        opening = _opening(args)
        mic = _microphone(args)
        audio = _audio_sink(args)  # last: it creates the file
    except _Refused as exc:
        printer.status(str(exc))
        return 2
    printer.dialect = opening.dialect  # (it reads the events as that wire spells them)
    state = _Run(args, printer, audio, mic)
    shown = " ".join(opening.urls)
    try:
        return await _attached(opening, state, lines, interrupts, open_stream, rng)
    except ReconnectFailed as exc:
        said = exc.last_error if exc.attempts <= 1 else str(exc)
        printer.status(f"cannot connect to {shown}: {said}")
        return 1
    except ClientError as exc:
        printer.status(f"cannot connect to {shown}: {exc}")
        return 1
    finally:
        if state.audio is not None:
            state.audio.close()
            printer.status(f"saved {state.audio.bytes} bytes of audio to {state.audio.path}")


async def _attached(
    opening: _Opening,
    state: _Run,
    lines: trio.MemoryReceiveChannel[str],
    interrupts: trio.MemoryReceiveChannel[int],
    open_stream: StreamFactories | None,
    rng: random.Random | None,
) -> int:
    """The session, from connecting until it ends, fails or is detached."""
    urls = opening.urls
    async with connect(
        urls if len(urls) > 1 else urls[0],
        opening.config,
        resume=opening.resume,
        options=opening.options,
        on_change=state.printer.change,
        open_stream=open_stream,
        rng=rng,
        ssl_context=opening.ssl_context,
        dialect=opening.dialect,
    ) as session:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(state.show_events, session)
            nursery.start_soon(state.feed, session, lines)
            nursery.start_soon(state.speak, session)
            nursery.start_soon(state.watch, session, interrupts, nursery)
            await state.done.wait()
            nursery.cancel_scope.cancel()
        if state.interrupts >= 2:
            return 0  # detached: leaving must not close it
    return state.exit_code


def _opening(args: argparse.Namespace) -> _Opening:
    """The session to open or resume, where, and how; raises _Refused."""
    resume = None
    config: dict[str, Any] | None = None
    if args.resume:
        token = args.token or os.environ.get(TOKEN_ENV)
        if not token:
            raise _Refused(f"--resume needs --token (or ${TOKEN_ENV})")
        resume = ResumeState(args.resume, token, args.last_seq)
    else:
        config = _new_session_config(args)
    dialect = dialect_named(args.dialect)
    urls = tuple(_full_url(url, dialect) for url in args.url)
    try:
        if len(urls) > 1:  # (one URL is checked by connecting, as it always was)
            parse_urls(urls)
    except ValueError as exc:
        raise _Refused(str(exc)) from None
    ssl_context = _ssl_context(args, urls)
    # No retries before the first attach: a wrong URL or a server that is down is said
    # at once. Once attached, an outage is retried (the session is worth resuming).
    policy = ReconnectPolicy(
        max_attempts=args.max_attempts, deadline=args.reconnect_deadline, retry_open=False
    )
    # An API key from the environment, not a flag: a flag would show in `ps`.
    options = ClientOptions(reconnect=policy, api_key=os.environ.get(API_KEY_VARIABLE) or None)
    return _Opening(urls, config, resume, options, ssl_context, dialect)


def _new_session_config(args: argparse.Namespace) -> dict[str, Any]:
    """``--session``, with the audio the ``--audio-*`` flags (and ``--mic``) ask for."""
    try:
        config = json.loads(args.session)
    except ValueError:
        config = None
    if not isinstance(config, dict):
        raise _Refused("--session must be a JSON object")
    if request := _audio_request(args):
        audio = config.get("audio")
        config["audio"] = {**(audio if isinstance(audio, dict) else {}), **request}
    return config


def _ssl_context(args: argparse.Namespace, urls: Sequence[str]) -> ssl.SSLContext | None:
    if not args.ca:
        return None
    if not all(url.startswith("wss://") for url in urls):
        raise _Refused("--ca needs a wss:// URL")
    try:
        return ssl.create_default_context(cafile=args.ca)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise _Refused(f"--ca {args.ca}: {getattr(exc, 'strerror', None) or exc}") from None


def _microphone(args: argparse.Namespace) -> Microphone | None:
    try:
        return open_wav(args.mic) if args.mic else None
    except MicError as exc:
        raise _Refused(f"--mic: {exc}") from None


def _audio_sink(args: argparse.Namespace) -> AudioSink | None:
    try:
        return AudioSink(args.save_audio) if args.save_audio else None
    except OSError as exc:
        raise _Refused(
            f"--save-audio: cannot write {args.save_audio}: {exc.strerror or exc}"
        ) from None


async def _main(args: argparse.Namespace, printer: Printer) -> int:
    lines_in, lines = trio.open_memory_channel[str](16)
    presses_in, presses = trio.open_memory_channel[int](16)

    async def read_stdin() -> None:
        async with lines_in:
            async for line in _stdin_lines():
                await lines_in.send(line)

    async def read_signals() -> None:
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async for signum in signals:
                presses_in.send_nowait(signum)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_stdin)
        nursery.start_soon(read_signals)
        code = await run(args, lines=lines, interrupts=presses, printer=printer)
        nursery.cancel_scope.cancel()
    return code


async def _stdin_lines(fd: int = 0) -> AsyncIterator[str]:
    """Lines of standard input, each with its newline (the last one may have none).

    Read with ``os.read`` in a thread that is abandoned when cancelled: no Python-level
    lock is held while it blocks, so the interpreter's shutdown does not race it, as it
    did ``sys.stdin.buffer.readline`` (``Fatal Python error: _enter_buffered_busy``).
    Not trio's FdStream: that makes the open file non-blocking, and on a terminal that
    is stdout's too."""
    pending = bytearray()
    while True:
        try:
            chunk = await trio.to_thread.run_sync(os.read, fd, 65536, abandon_on_cancel=True)
        except OSError:  # e.g. stdin closed (EBADF): no more input
            chunk = b""
        if not chunk:
            break
        pending += chunk
        while (end := pending.find(b"\n")) >= 0:
            yield pending[: end + 1].decode("utf-8", "replace")
            del pending[: end + 1]
    if pending:
        yield pending.decode("utf-8", "replace")


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    color = args.color == "always" or (
        args.color == "auto"
        and sys.stdout.isatty()
        and "NO_COLOR" not in os.environ
        and os.environ.get("TERM") != "dumb"
    )
    printer = Printer(sys.stdout, sys.stderr, raw_json=args.json, color=color)
    try:
        return trio.run(_main, args, printer)
    except KeyboardInterrupt:  # a Ctrl-C before the signal receiver was installed
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
