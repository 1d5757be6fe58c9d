// Exactly-once through a proxy that cuts connections at random points (mid-handshake,
// mid-frame, by FIN or RST), and a silent server found by the heartbeat deadline.

import assert from "node:assert/strict";
import { before, test } from "node:test";

import { connect } from "../src/trio-duplex.js";
import { echoUrl, startProxy } from "./helpers.js";

let URL_;
before(async () => {
  URL_ = await echoUrl();
});

const RECONNECT = { baseDelayMs: 5, maxDelayMs: 50, maxAttempts: 50 };

/** Send `count` text events while reading, through `url`; returns what arrived. */
async function roundTrip(url, count, options = {}) {
  const session = await connect(url, { reconnect: RECONNECT, ...options });
  const sent = Array.from({ length: count }, (_, i) => `e${i + 1}`);
  const received = [];
  const reader = (async () => {
    for await (const event of session) {
      received.push(event);
      if (received.length === count) break;
    }
  })();
  for (const value of sent) await session.send({ type: "input.text.append", text: value });
  await reader;
  await session.close();
  return { session, sent, received };
}

for (const seed of [1, 2, 3, 4]) {
  test(`cutting proxy (seed ${seed}): every event once and in order, both ways`, async () => {
    const proxy = await startProxy(URL_, { seed, maxCuts: 12, maxBytes: 4000 });
    const { session, sent, received } = await roundTrip(proxy.url, 400);
    // Server -> client: seqs 1..400, each once, in order (no gap: nothing was lost).
    assert.deepEqual(
      received.map((e) => e.server_event_seq),
      sent.map((_, i) => i + 1),
    );
    // Client -> server: the echo engine answered every event exactly once, in order,
    // so the server received each once (a resend it already had is dropped by seq).
    assert.deepEqual(
      received.map((e) => e.text),
      sent,
    );
    assert.equal(proxy.cuts, 12);
    assert.ok(session.stats.resumes >= 1, JSON.stringify(session.stats));
  });
}

test("a silent server: no heartbeat_ack within the timeout, the client resumes", async () => {
  // The first connection stops passing the server's bytes after its handshake and a
  // few events, and stays open; only the heartbeat deadline can tell.
  const proxy = await startProxy(URL_, { seed: 7, maxCuts: 1, mode: "stall", minBytes: 1500, maxBytes: 2500 });
  const changes = [];
  const { session, sent, received } = await roundTrip(proxy.url, 100, {
    heartbeat: { intervalMs: 100, timeoutMs: 200 },
    onChange: (c) => changes.push(c),
  });
  assert.deepEqual(
    received.map((e) => [e.server_event_seq, e.text]),
    sent.map((text, i) => [i + 1, text]),
  );
  const lost = changes.find((c) => c.kind === "disconnected");
  assert.ok(lost, "no disconnection");
  assert.match(lost.reason, /no heartbeat_ack within 0.2s/);
  assert.equal(session.stats.resumes, 1);
});
