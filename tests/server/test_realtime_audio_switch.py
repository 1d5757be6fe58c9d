"""``session.audio`` changed by a ``session.update`` after the open, over a real socket:
taken while no audio has passed either way (OpenAI clients set the format right after
``session.created``), the input after it decoded and the output encoded in the new
format; once audio has passed, a different format is ``bad_event``, the same one is
no change."""

from __future__ import annotations

import base64

from websockets.trio.client import connect

from .test_realtime_wiring import receive, send, serving

ULAW = {"input": {"format": "g711_ulaw"}, "output": {"format": "g711_ulaw"}}
PCM_20_MS = 960  # bytes of 20 ms of 24 kHz PCM16, the default format
ULAW_20_MS = 160  # bytes of 20 ms of 8 kHz G.711


async def test_audio_switches_until_audio_has_passed() -> None:
    async with serving() as (url, _), connect(f"{url}/v1/duplex") as ws:
        await send(ws, type="session.update", session={})
        created = await receive(ws)
        assert created["type"] == "session.created"

        await send(ws, type="session.update", session={"audio": ULAW})
        updated = await receive(ws)
        assert updated["type"] == "session.updated", updated

        audio = base64.b64encode(bytes(range(ULAW_20_MS))).decode()
        for seq in range(1, 7):  # (the codecs' resamplers hold back a few ms)
            await send(ws, type="input_audio_buffer.append", audio=audio, client_event_seq=seq)
        sizes: list[int] = []
        while sum(sizes) < 2 * ULAW_20_MS:  # the echo, re-encoded in the new format
            delta = await receive(ws)
            assert delta["type"] == "response.output_audio.delta", delta
            sizes.append(len(base64.b64decode(delta["audio"])))
        assert max(sizes) == ULAW_20_MS  # (20 ms of PCM16 at 24 kHz would be PCM_20_MS)

        await send(ws, type="session.update", session={"audio": {"wire": "json"}})
        refused = await receive(ws)
        while refused["type"] == "response.output_audio.delta":  # the rest of the echo
            refused = await receive(ws)
        assert (refused["type"], refused["code"], refused["param"]) == (
            "error",
            "bad_event",
            "session.audio",
        )
        await send(ws, type="session.update", session={"audio": updated["session"]["audio"]})
        again = await receive(ws)
        assert again["type"] == "session.updated", again  # the same format: no change
