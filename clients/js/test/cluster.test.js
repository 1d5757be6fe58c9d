// A deploy in a cluster (session.going_away {migrating: true}): the client resumes on
// another node at once, and the application sees every event once and in order.
//
// Needs a cluster, which tests/cluster/test_js_client_cluster.py starts (three nodes on
// a real redis-server) and names in TRIO_DUPLEX_CLUSTER: a JSON list of {url, pid}.
// Without it (`npm test` alone, or the run of every file by tests/js) it is skipped.
// TRIO_DUPLEX_DIALECT=openai runs it over /v1/realtime (OpenAI's events, our resume).

import assert from "node:assert/strict";
import { test } from "node:test";

import { connect } from "../src/trio-duplex.js";

const CLUSTER = process.env.TRIO_DUPLEX_CLUSTER ? JSON.parse(process.env.TRIO_DUPLEX_CLUSTER) : null;
const skip = CLUSTER === null ? "no cluster (TRIO_DUPLEX_CLUSTER): run by tests/cluster/test_js_client_cluster.py" : false;
const DIALECT = process.env.TRIO_DUPLEX_DIALECT ?? "native";

/** The node's URL in the dialect's path. */
function inDialect(url) {
  if (DIALECT === "native") return url;
  const parsed = new URL(url);
  parsed.pathname = "/v1/realtime";
  return parsed.toString();
}

/** What a text turn is, and what answers it, in the dialect. */
const SPELLING = {
  native: {
    session: {},
    turn: (text) => [{ type: "input.text.append", text }],
    answer: (event) => (event.type === "response.output_text.delta" ? event.text : null),
  },
  openai: {
    session: { output_modalities: ["text"] },
    turn: (text) => [
      { type: "conversation.item.create", item: { type: "message", role: "user", content: [{ type: "input_text", text }] } },
      { type: "response.create" },
    ],
    // (each echo response is one delta: its whole text)
    answer: (event) => (event.type === "response.output_text.delta" ? event.delta : null),
  },
}[DIALECT];

test("a deploy moves the session to another node without the application noticing", { skip }, async () => {
  const byUrl = new Map(CLUSTER.map((node) => [inDialect(node.url), node.pid]));
  const changes = [];
  const session = await connect([...byUrl.keys()], {
    dialect: DIALECT,
    session: SPELLING.session,
    reconnect: { baseDelayMs: 10, maxDelayMs: 200, maxAttempts: 50 },
    heartbeat: { intervalMs: 1000, timeoutMs: 1000 },
    onChange: (change) => changes.push(change),
  });
  const home = session.url;
  const sent = Array.from({ length: 300 }, (_, i) => `event ${i}`);
  const got = [];
  const seen = [];
  const reader = (async () => {
    for await (const event of session) {
      const text = SPELLING.answer(event);
      if (text !== null) got.push(text);
      seen.push(event);
      if (got.length === sent.length) break;
    }
  })();
  for (const [i, value] of sent.entries()) {
    for (const event of SPELLING.turn(value)) await session.send(event);
    if (i === 100) {
      process.kill(byUrl.get(home), "SIGTERM"); // a rolling deploy reaches it
      console.log(`deployed ${home}`); // (for the harness)
    }
    if (i % 20 === 19) await session.confirm(); // pace: the engine's input is bounded
  }
  await reader;
  assert.notEqual(session.url, home); // it goes on elsewhere
  assert.deepEqual(got, sent);
  const seqs = seen.filter((e) => Number.isInteger(e.server_event_seq)).map((e) => e.server_event_seq);
  assert.deepEqual(
    seqs,
    seqs.map((_, i) => i + 1),
  );
  if (DIALECT === "native") assert.equal(seqs.length, sent.length);
  const going = seen.filter((e) => e.type === "session.going_away");
  assert.equal(going.length, 1);
  assert.equal(going[0].migrating, true);
  assert.ok(changes.some((c) => c.kind === "going_away" && c.migrating));
  // Resumed at once: the first retry after the migration has no backoff.
  const lost = changes.findIndex((c) => c.kind === "disconnected");
  assert.deepEqual(
    [changes[lost + 1].kind, changes[lost + 1].delayMs],
    ["retrying", 0],
  );
  await session.close();
});
