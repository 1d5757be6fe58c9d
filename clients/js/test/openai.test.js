// The OpenAI dialect ({dialect: "openai"}, /v1/realtime) against a real server: a text
// turn, a resume by the upgrade's query after a cut, an API key and the resume token as
// the subprotocol openai-insecure-api-key.TOKEN, and exactly-once through a proxy that
// cuts connections at random points.

import assert from "node:assert/strict";
import { before, test } from "node:test";

import { connect } from "../src/trio-duplex.js";
import { API_KEY, authUrl, echoUrl, startProxy } from "./helpers.js";

let URL_;
let AUTH_URL;
before(async () => {
  URL_ = realtime(await echoUrl());
  AUTH_URL = realtime(await authUrl());
});

/** The same server's /v1/realtime. */
function realtime(url) {
  const parsed = new URL(url);
  parsed.pathname = "/v1/realtime";
  parsed.search = "?model=echo";
  return parsed.toString();
}

const RECONNECT = { baseDelayMs: 5, maxDelayMs: 50, maxAttempts: 50 };
const SESSION = { output_modalities: ["text"] };

function turn(text) {
  const item = { type: "message", role: "user", content: [{ type: "input_text", text }] };
  return [{ type: "conversation.item.create", item }, { type: "response.create" }];
}

/** The text of the next `count` responses (deltas joined at response.done). */
async function answers(session, count, seen = []) {
  const got = [];
  const pending = new Map();
  for await (const event of session) {
    seen.push(event);
    if (event.type === "response.output_text.delta" || event.type === "response.output_audio_transcript.delta") {
      pending.set(event.response_id, (pending.get(event.response_id) ?? "") + event.delta);
    } else if (event.type === "response.done") {
      got.push(pending.get(event.response.id) ?? "");
      if (got.length === count) break;
    }
  }
  return got;
}

function contiguous(seen) {
  const seqs = seen.filter((e) => Number.isInteger(e.server_event_seq)).map((e) => e.server_event_seq);
  assert.deepEqual(seqs, seqs.map((_, i) => i + 1));
  for (const e of seen) if (Number.isInteger(e.server_event_seq)) assert.equal(e.event_id, `event_${e.server_event_seq}`);
}

test("openai: a text turn, then a cut resumed by the upgrade's query", async () => {
  const session = await connect(URL_, { dialect: "openai", session: SESSION, reconnect: RECONNECT });
  assert.equal(session.dialect, "openai");
  assert.equal(session.config.type, "realtime");
  for (const event of turn("hello")) await session.send(event);
  const seen = [];
  assert.deepEqual(await answers(session, 1, seen), ["hello"]);
  session.dropConnection();
  for (const event of turn("again")) await session.send(event);
  assert.deepEqual(await answers(session, 1, seen), ["again"]);
  assert.equal(session.stats.resumes, 1);
  contiguous(seen);
  await session.close();
});

test("openai: an API key and the resume token as the subprotocol credential", async () => {
  const session = await connect(AUTH_URL, { dialect: "openai", session: SESSION, token: API_KEY, reconnect: RECONNECT });
  for (const event of turn("one")) await session.send(event);
  assert.deepEqual(await answers(session, 1), ["one"]);
  const state = await session.detach();
  const resumed = await connect(AUTH_URL, { dialect: "openai", resume: state, reconnect: RECONNECT }); // no key
  for (const event of turn("two")) await resumed.send(event);
  assert.deepEqual(await answers(resumed, 1), ["two"]);
  await resumed.close();
});

for (const seed of [1, 2]) {
  test(`openai: cutting proxy (seed ${seed}): every event once and in order, both ways`, async () => {
    const proxy = await startProxy(URL_, { seed, maxCuts: 8, maxBytes: 6000 });
    const session = await connect(proxy.url, { dialect: "openai", session: SESSION, reconnect: RECONNECT });
    const sent = Array.from({ length: 60 }, (_, i) => `t${i + 1}`);
    const seen = [];
    const reading = answers(session, sent.length, seen);
    for (const [i, value] of sent.entries()) {
      for (const event of turn(value)) await session.send(event);
      if (i % 10 === 9) await session.confirm(); // pace: the engine's input is bounded
    }
    assert.deepEqual(await reading, sent);
    contiguous(seen);
    assert.equal(proxy.cuts, 8);
    assert.ok(session.stats.resumes >= 1, JSON.stringify(session.stats));
    await session.close();
  });
}
