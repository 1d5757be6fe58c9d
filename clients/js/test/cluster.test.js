// A deploy in a cluster (session.going_away {migrating: true}): the client resumes on
// another node at once, and the application sees every event once and in order.
//
// Needs a cluster, which tests/cluster/test_js_client_cluster.py starts (three nodes on
// a real redis-server) and names in TRIO_DUPLEX_CLUSTER: a JSON list of {url, pid}.
// Without it (`npm test` alone, or the run of every file by tests/js) it is skipped.

import assert from "node:assert/strict";
import { test } from "node:test";

import { connect } from "../src/trio-duplex.js";

const CLUSTER = process.env.TRIO_DUPLEX_CLUSTER ? JSON.parse(process.env.TRIO_DUPLEX_CLUSTER) : null;
const skip = CLUSTER === null ? "no cluster (TRIO_DUPLEX_CLUSTER): run by tests/cluster/test_js_client_cluster.py" : false;

test("a deploy moves the session to another node without the application noticing", { skip }, async () => {
  const byUrl = new Map(CLUSTER.map((node) => [node.url, node.pid]));
  const changes = [];
  const session = await connect([...byUrl.keys()], {
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
      if (event.type === "response.output_text.delta") got.push(event);
      else seen.push(event);
      if (got.length === sent.length) break;
    }
  })();
  for (const [i, value] of sent.entries()) {
    await session.send({ type: "input.text.append", text: value });
    if (i === 100) {
      process.kill(byUrl.get(home), "SIGTERM"); // a rolling deploy reaches it
      console.log(`deployed ${home}`); // (for the harness)
    }
    if (i % 20 === 19) await session.confirm(); // pace: the engine's input is bounded
  }
  await reader;
  assert.notEqual(session.url, home); // it goes on elsewhere
  assert.deepEqual(
    got.map((e) => e.text),
    sent,
  );
  assert.deepEqual(
    got.map((e) => e.server_event_seq),
    sent.map((_, i) => i + 1),
  );
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
