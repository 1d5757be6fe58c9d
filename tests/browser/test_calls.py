"""OpenAI's WebRTC flow in a real headless Chromium against a real ``trio-duplex serve
--calls`` (issue 28, docs/plans/webrtc.md §5.5): a page of another origin makes a peer
connection with the ``oai-events`` data channel and the fake microphone's track, POSTs its
offer to ``/v1/realtime/calls`` with a client secret the test minted with the API key,
and sets the answer. Then a typed turn and a spoken one (the microphone), the reply's
audio heard (``getStats``), and the page's ``pc.close()`` in the middle of a response
followed by a resume on a new peer connection: every text event once, in order.

On ``voice`` the microphone plays a tone (the engine hears no words; the page commits
its turn, as a client does without turn detection), on ``speech`` the outside set's first
sentence said by espeak-ng: what the engine heard is judged only by being heard (its
transcript not empty) and answered, never by its words (one sentence is too few to judge,
tests/speech_audio.py).

Then OpenAI's Agents SDK (``@openai/agents-realtime``'s browser bundle, pinned in
tests/openai_sdk/node), unchanged: its ``OpenAIRealtimeWebRTC`` connects with a client
secret, a typed turn, ``interrupt()`` while the reply plays (``output_audio_buffer.cleared``)
and ``close()``.

The pages (calls_page.html/js, sdk_page.html/js) come from a tiny ``http.server`` on
another port of 127.0.0.1 (another origin: the POSTs are CORS, preflighted for
``Authorization``). What a page saw is in its global's ``seen`` (``window.calls``,
``window.sdk``); every wait is on it, with a deadline; no page may log a console error or
reach any origin but the two.
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from playwright.sync_api import Browser, Page, Playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from ..helpers import ServerProcess, Servers
from ..openai_sdk.conftest import openai_node  # noqa: F401  (the SDK page's bundle)
from ..speech_audio import RATE, at_rate, reply_to, said, sentences, write_wav
from .conftest import MIC_RATE, chromium, static_origin, write_mic_wav
from .page import Watched

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
PAGE_FILES = ("calls_page.html", "calls_page.js", "sdk_page.html", "sdk_page.js")
SDK_BUNDLE = "@openai/agents-realtime/dist/bundle/openai-realtime-agents.umd.js"
KEY = "k-calls-browser-test"
WAIT_MS = 20_000  # the deadline of a wait on the page
TURN_MS = 60_000  # ... of a spoken turn (the microphone plays in real time, in a loop)
# The sentence's microphone, from getUserMedia on: silence while the typed turn is
# answered, the sentence, then silence while its reply and the resumed one play whole
# (the engine's turn detection stops a reply when it hears speech: the next loop's).
LEAD_S = 8.0
TAIL_S = 20.0
LONG = " ".join(["this reply is long enough to be cut in the middle"] * 3)
TRANSCRIPT_DELTAS = ("response.output_audio_transcript.delta", "response.output_text.delta")
LOCATION = re.compile(r"/v1/realtime/calls/rtc_[0-9a-f]{32}")
CHROMIUM_WEBRTC = (
    "--allow-loopback-in-peer-connection",  # gather 127.0.0.1 (the server's candidate)
    "--disable-features=WebRtcHideLocalIpsWithMdns",  # raw IPs, no .local names
)
PCM_24K = {"type": "audio/pcm", "rate": 24000}
SDK_SESSION: dict[str, Any] = {
    # What the Agents SDK's session.updates set once its data channel is open (its
    # defaults, and connect()'s model; then tracing "auto" on session.created). A client
    # secret locks its session's configuration: an update that changes it is refused
    # config_locked (docs/openai.md), so the secret locks what the SDK will restate.
    # (The formats are ignored on a call: its audio is its tracks'.)
    "type": "realtime",
    "model": "x",
    "tracing": "auto",
    "output_modalities": ["audio"],
    "audio": {
        "input": {
            "format": PCM_24K,
            "noise_reduction": None,
            "transcription": {"model": "gpt-4o-mini-transcribe"},
            "turn_detection": {"type": "semantic_vad"},
        },
        "output": {"format": PCM_24K, "speed": 1},
    },
}
SESSION: dict[str, dict[str, Any]] = {
    # What the client secret locks. The speech engine's turn detection answers nothing by
    # itself: the page answers the turn it heard, with a response.create.
    "voice": {"type": "realtime"},
    "speech": {
        "type": "realtime",
        "audio": {
            "input": {
                "turn_detection": {
                    "type": "server_vad",
                    "create_response": False,
                }
            }
        },
    },
}


def write_sentence_wav(path: Path) -> None:
    """The outside set's first sentence (espeak-ng) at the microphone's rate, between
    silences (Chromium plays the file in a loop)."""
    parts = [
        np.zeros(int(LEAD_S * RATE), dtype=np.int16),
        np.frombuffer(said(sentences(1)[0]), dtype=np.int16),
        np.zeros(int(TAIL_S * RATE), dtype=np.int16),
    ]
    write_wav(path, at_rate(np.concatenate(parts).tobytes(), RATE, MIC_RATE), MIC_RATE)


@pytest.fixture(scope="module")
def page_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the pages' origin serves: their files, nothing else."""
    folder = tmp_path_factory.mktemp("page")
    for name in PAGE_FILES:
        shutil.copy(HERE / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def page_origin(page_folder: Path) -> Iterator[str]:
    """The pages' origin: an ``http.server`` of its own on 127.0.0.1."""
    with static_origin(page_folder) as origin:
        yield origin


@pytest.fixture(scope="module", params=["voice", "speech"])
def engine(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "speech":
        request.getfixturevalue("speech_parts")  # needs_speech: skip, or fail in CI
    return name


@pytest.fixture(scope="module")
def call_browser(
    engine: str, playwright: Playwright, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Browser]:
    wav = tmp_path_factory.mktemp("mic") / f"{engine}.wav"
    if engine == "speech":
        write_sentence_wav(wav)
    else:
        write_mic_wav(wav)
    with chromium(playwright, wav, extra_args=CHROMIUM_WEBRTC) as browser:
        yield browser


@pytest.fixture(scope="module")
def call_server(
    engine: str, page_origin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(f"browser: {KEY}\n")
    servers = Servers()
    try:
        yield servers.start(
            "--calls",
            "--call-allow-peer",
            "127.0.0.0/8",
            "--engine",
            engine,
            "--api-key-file",
            str(keys),
            "--allow-origin",
            page_origin,
            ready_timeout=60 if engine == "speech" else 15,
        )
    finally:
        servers.stop_all()


def mint_secret(server: ServerProcess, session: dict[str, Any]) -> str:
    """A client secret for a browser, minted with the API key (what an app's backend does)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/v1/realtime/client_secrets",
        data=json.dumps({"session": session}).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        value: str = json.loads(answer.read())["value"]
    assert value.startswith("ek_")
    return value


class CallPage(Watched):
    """A page (``name``.html, whose script's global ``name`` holds what it saw in
    ``seen``), watched: its script errors, console errors and every request it makes."""

    def __init__(self, page: Page, origin: str, server: ServerProcess, name: str) -> None:
        super().__init__(page)
        self.name = name
        self.origin = origin
        self.base = f"http://127.0.0.1:{server.port}"
        page.goto(f"{origin}/{name}_page.html")

    def seen(self) -> dict[str, Any]:
        value: dict[str, Any] = self.page.evaluate(f"() => {self.name}.seen")
        return value

    def events(self) -> list[dict[str, Any]]:
        """Every data-channel event so far, each with the index of its peer connection."""
        return [{**e["event"], "pc": e["pc"]} for e in self.seen()["events"]]

    def until(self, predicate: str, arg: object = None, timeout: float = WAIT_MS) -> Any:
        """Wait until ``predicate`` (a JS function of the page's global and ``arg``)
        holds; returns what it returned."""
        try:
            handle = self.page.wait_for_function(
                f"(arg) => ({predicate})(window.{self.name}, arg)",
                arg=arg,
                timeout=timeout,
                polling=100,
            )
        except PlaywrightTimeoutError:
            seen = self.seen()
            events = [e["event"] for e in seen.pop("events")]
            errors = [e for e in events if e["type"] == "error"]
            raise AssertionError(
                f"{predicate} never held: saw {len(events)} events, the last ones "
                f"{[e['type'] for e in events[-20:]]}; {len(errors)} errors, the first "
                f"{errors[:1]}; {seen}"
            ) from None
        return handle.json_value()

    def until_event(self, kind: str, after: int = 0, timeout: float = WAIT_MS) -> dict[str, Any]:
        """The first event of type ``kind`` at an index ``after`` or later, once it came."""
        index: int = self.until(
            "(c, [kind, after]) => { const i = c.seen.events.findIndex("
            "(e, n) => n >= after && e.event.type === kind); return i >= 0 ? i + 1 : 0; }",
            [kind, after],
            timeout,
        )
        return self.events()[index - 1] | {"index": index - 1}

    def check_clean(self) -> None:
        assert self.errors == []
        outside = [url for url in self.requests if not url.startswith((self.origin, self.base))]
        assert outside == [], outside


@pytest.fixture
def call_page(
    call_browser: Browser, page_origin: str, call_server: ServerProcess
) -> Iterator[CallPage]:
    context = call_browser.new_context()
    try:
        yield CallPage(context.new_page(), page_origin, call_server, "calls")
    finally:
        context.close()


def said_in(events: list[dict[str, Any]], response_id: str) -> str:
    """The text of a response's transcript (or text) deltas, joined."""
    return "".join(
        e["delta"]
        for e in events
        if e["type"] in TRANSCRIPT_DELTAS and e.get("response_id") == response_id
    )


def done_text(done: dict[str, Any]) -> str:
    """What a ``response.done`` says its response said (transcripts and texts)."""
    return "".join(
        part.get("transcript") or part.get("text") or ""
        for item in done["response"]["output"]
        for part in item.get("content", [])
    )


def check_post(post: dict[str, Any]) -> None:
    """The 201 of a POST /v1/realtime/calls, as the page read it (so ``Location`` is
    exposed to another origin)."""
    assert post["status"] == 201, post
    assert post["contentType"] == "application/sdp", post
    assert post["location"] is not None and LOCATION.fullmatch(post["location"]), post


def test_a_call_talks_listens_and_resumes(
    call_page: CallPage, call_server: ServerProcess, engine: str
) -> None:
    page = call_page
    secret = mint_secret(call_server, SESSION[engine])
    check_post(page.page.evaluate("([b, s]) => calls.start(b, s)", [page.base, secret]))
    created = page.until_event("session.created")
    assert created["index"] == 0 and created["pc"] == 0
    assert set(created["resume"]) >= {"session_id", "resume_token", "attachment_generation"}

    # A typed turn, answered aloud.
    page.page.evaluate("() => calls.say('hello')")
    done = page.until_event("response.done")
    assert done["response"]["status"] == "completed", done
    typed = done_text(done)
    assert typed == ("hello" if engine == "voice" else reply_to("hello"))
    assert said_in(page.events(), done["response"]["id"]) == typed

    # A spoken turn, from the fake microphone.
    after = len(page.events())
    if engine == "voice":  # no turn detection: the page ends the turn
        page.page.evaluate("() => calls.send({type: 'input_audio_buffer.commit'})")
        page.until_event("input_audio_buffer.committed", after)
        heard = None
    else:
        completed = page.until_event(
            "conversation.item.input_audio_transcription.completed", after, TURN_MS
        )
        heard = completed["transcript"]
        assert heard.strip(), completed  # heard: not judged by its words (one sentence)
    page.page.evaluate("() => calls.send({type: 'response.create'})")
    done = page.until_event("response.done", after, TURN_MS)
    assert done["response"]["status"] == "completed", done
    if heard is not None:
        assert done_text(done) == reply_to(heard)

    # The replies' audio was played: with energy, and the samples still growing.
    page.page.evaluate("() => calls.watchInbound()")
    stats = page.until("(c) => c.seen.inbound.energy > 0.01 && c.seen.inbound")
    assert stats["energy"] > 0.01, stats
    page.until("(c, n) => c.seen.inbound.samples > n", stats["samples"])

    # The page hangs up in the middle of a response, then resumes on a new peer connection.
    page.page.evaluate("(types) => calls.closeOn(types)", list(TRANSCRIPT_DELTAS))
    after = len(page.events())
    page.page.evaluate("(text) => calls.say(text)", LONG)
    page.until("(c) => c.seen.closedAt !== null && c.pcState() === 'closed'")
    seen = page.seen()
    last = seen["lastSeq"]
    assert seen["closedAt"]["seq"] == last  # the delta was the last event of the first pc
    check_post(page.page.evaluate("(b) => calls.resume(b)", page.base))
    assert page.seen()["posts"][0]["location"] != page.seen()["posts"][1]["location"]
    resumed = page.until_event("session.resumed", after)
    assert resumed["pc"] == 1 and resumed["session_id"] == created["resume"]["session_id"]
    assert resumed["index"] == len([e for e in page.events() if e["pc"] == 0])  # its first
    done = page.until_event("response.done", resumed["index"], TURN_MS)
    assert done["pc"] == 1 and done["response"]["status"] == "completed", done

    events = page.events()
    seqs = [e["server_event_seq"] for e in events if "server_event_seq" in e]
    assert seqs == sorted(set(seqs)), seqs  # strictly increasing: no duplicate, no reorder
    replayed = [e for e in events if e["pc"] == 1 and "server_event_seq" in e]
    assert replayed and replayed[0]["server_event_seq"] > last
    # The cut response's text, from both peer connections, is its whole transcript.
    response_id = done["response"]["id"]
    assert said_in(events, response_id) == done_text(done)
    assert said_in([e for e in events if e["pc"] == 0], response_id)  # begun on the first
    assert done_text(done) == (LONG if engine == "voice" else reply_to(LONG))
    assert page.page.evaluate("() => calls.pcState()") == "connected"
    page.check_clean()


@pytest.fixture
def sdk_page(
    call_browser: Browser,
    page_folder: Path,
    page_origin: str,
    call_server: ServerProcess,
    request: pytest.FixtureRequest,
) -> Iterator[CallPage]:
    """sdk_page.html, with the Agents SDK's bundle from the pinned node_modules
    (tests/openai_sdk/node: .ci/run's npm ci, else built once in a cache)."""
    modules: Path = request.getfixturevalue("openai_node").modules
    shutil.copy(modules / SDK_BUNDLE, page_folder / Path(SDK_BUNDLE).name)
    context = call_browser.new_context()
    try:
        yield CallPage(context.new_page(), page_origin, call_server, "sdk")
    finally:
        context.close()


# On speech: its replies are synthesised faster than they play, so audio is queued when
# interrupt() comes (the voice engine's real-time audio leaves almost none: its cancel
# finds the reply played out, and Playout says stopped instead).
@pytest.mark.parametrize("engine", ["speech"], indirect=True)
def test_the_agents_sdk_calls_talks_and_interrupts(
    sdk_page: CallPage, call_server: ServerProcess
) -> None:
    page = sdk_page
    secret = mint_secret(call_server, SDK_SESSION)
    # connect() resolves once the SDK's own session.update is answered session.updated.
    page.page.evaluate("([b, s]) => sdk.connect(b, s)", [page.base, secret])
    seen = page.seen()
    types = [e["event"]["type"] for e in seen["events"]]
    assert types[0] == "session.created" and "session.updated" in types, seen["events"]
    assert seen["callId"] is not None and re.fullmatch(r"rtc_[0-9a-f]{32}", seen["callId"])
    assert seen["statuses"][-1] == "connected"

    # A typed turn (the SDK's sendMessage: the item, then response.create).
    page.page.evaluate("() => sdk.say('hello')")
    done = page.until_event("response.done")
    assert done["response"]["status"] == "completed", done
    assert done_text(done) == reply_to("hello")

    # interrupt() while the reply plays: response.cancel, then output_audio_buffer.clear.
    after = done["index"] + 1
    page.page.evaluate("(text) => sdk.say(text)", LONG)
    page.until_event("output_audio_buffer.started", after)
    page.page.evaluate("() => sdk.interrupt()")
    page.until_event("output_audio_buffer.cleared", after)
    cancelled = page.until_event("response.done", after)
    assert cancelled["response"]["status"] == "cancelled", cancelled

    page.page.evaluate("() => sdk.close()")
    assert page.page.evaluate("() => sdk.status()") == "disconnected"
    assert page.seen()["errors"] == []  # (no error event: none refused)
    page.check_clean()
