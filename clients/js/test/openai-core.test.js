// The state machine speaking the OpenAI dialect (SessionCore with dialect "openai"),
// alone, as tests/client/test_openai_state.py drives the Python one: the server speaks
// first, session.created carries a `resume` object, the configuration is the first
// numbered event, a resume is the upgrade's query, errors nest their fields.

import assert from "node:assert/strict";
import { test } from "node:test";

import { ProtocolViolation, ResumeRefused, ServerRefused, SessionCore, audioBytes, connect } from "../src/trio-duplex.js";

const ACKS = { everyEvents: 3, everyBytes: 1 << 20, maxDelayMs: 500 };
const HEARTBEAT = { intervalMs: 15000, timeoutMs: 10000, confirmEvery: 64 };
const URL_ = "ws://h:1/v1/realtime?model=gpt-realtime";
const SESSION = { type: "realtime", object: "realtime.session", id: "s1" };
const CREATED = {
  type: "session.created",
  event_id: "event_x1",
  session: SESSION,
  resume: {
    session_id: "s1",
    resume_token: "t1",
    attachment_generation: 1,
    limits: { disconnect_grace_s: 30, idle_ttl_s: 300, journal_max_bytes: 8 << 20, max_event_bytes: 1000 },
  },
};
const RESUMED = (received) => ({
  type: "session.resumed",
  event_id: "event_x2",
  session_id: "s1",
  resume_token: "t2",
  attachment_generation: 2,
  last_received_client_event_seq: received,
});
const error = (code, fields = {}) => ({
  type: "error",
  event_id: "event_x3",
  error: { type: "invalid_request_error", code, message: code, param: null, event_id: null, ...fields },
});

function drain(core, now) {
  const frames = [];
  for (let frame = core.nextFrame(now); frame !== null; frame = core.nextFrame(now)) frames.push(JSON.parse(frame));
  return frames;
}

function opened(config = {}) {
  const core = new SessionCore(config, ACKS, HEARTBEAT, null, "openai");
  assert.equal(core.openingUrl(URL_), URL_);
  assert.equal(core.openingFrame(), null); // the server speaks first
  core.onHandshake(CREATED, 0);
  return core;
}

test("openai: session.created's resume object; the configuration is event 1", () => {
  const core = opened({ instructions: "hi" });
  assert.deepEqual([core.sessionId, core.resumeToken, core.generation], ["s1", "t1", 1]);
  assert.equal(core.limits.max_event_bytes, 1000);
  assert.deepEqual(core.config, SESSION);
  assert.deepEqual(drain(core, 0), [
    { type: "session.update", session: { type: "realtime", instructions: "hi" }, client_event_seq: 1 },
  ]);
  assert.deepEqual(drain(opened(), 0), [{ type: "session.heartbeat" }]); // no config: the hello
  assert.throws(() => new SessionCore({}, ACKS, HEARTBEAT, null, "openai").onHandshake({ ...CREATED, resume: null }, 0), ProtocolViolation);
  assert.throws(() => new SessionCore({}, ACKS, HEARTBEAT, null, "klingon"), TypeError);
});

test("openai: a resume is the upgrade's query, and exactly the unread events are resent", () => {
  const core = opened({ instructions: "x" });
  core.enqueue({ type: "response.create" });
  core.enqueue({ type: "response.cancel" });
  assert.deepEqual(drain(core, 0).map((f) => f.client_event_seq), [1, 2, 3]);
  core.onEvent({ type: "response.done", server_event_seq: 5 }, 40, 0);
  const dialled = new URL(core.openingUrl(URL_));
  assert.deepEqual([...dialled.searchParams], [
    ["model", "gpt-realtime"],
    ["resume", "s1"],
    ["last_received_server_event_seq", "5"],
  ]);
  assert.equal(core.openingFrame(), null);
  core.onHandshake(RESUMED(2), 1);
  assert.equal(core.resumeToken, "t2");
  assert.deepEqual(drain(core, 1).map((f) => f.client_event_seq), [3]);
});

test("openai: refusals are read from the nested error", () => {
  assert.throws(
    () => new SessionCore({}, ACKS, HEARTBEAT, null, "openai").onHandshake(error("server_shutting_down", { retryable: true }), 0),
    (e) => e instanceof ServerRefused && e.code === "server_shutting_down" && e.retryable,
  );
  const back = new SessionCore({}, ACKS, HEARTBEAT, { sessionId: "s1", resumeToken: "t1", lastServerEventSeq: 0 }, "openai");
  assert.throws(() => back.onHandshake(error("invalid_resume_token"), 0), ResumeRefused);
  const core = opened();
  drain(core, 0);
  for (const audio of ["a", "b", "c"]) core.enqueue({ type: "input_audio_buffer.append", audio });
  assert.deepEqual(drain(core, 0).map((f) => f.client_event_seq), [1, 2, 3]);
  assert.equal(core.onEvent(error("input_backpressure", { client_event_seq: 2, retryable: true }), 90, 1), "internal");
  assert.equal(core.rewinds, 1);
  const stale = error("unexpected_client_event_seq", { client_event_seq: 3, expected_client_event_seq: 2 });
  assert.equal(core.onEvent(stale, 90, 1), "internal"); // the answer to 3 sent before the rewind
  assert.deepEqual(drain(core, 2000).map((f) => f.client_event_seq), [2, 3]);
  assert.equal(core.onEvent(error("bad_event", { client_event_seq: 3 }), 90, 2000), "deliver");
});

test("openai: session.updated states the whole configuration; output audio is delta", () => {
  const core = opened({ audio: { wire: "binary" } });
  assert.equal(core.audioWire, "json");
  const whole = { ...SESSION, audio: { wire: "binary" } };
  assert.equal(core.onEvent({ type: "session.updated", server_event_seq: 1, session: whole }, 50, 0), "deliver");
  assert.deepEqual(core.config, whole);
  assert.equal(core.audioWire, "binary");
  assert.deepEqual([...audioBytes({ type: "response.output_audio.delta", delta: "AAEC" })], [0, 1, 2]);
});

test("an unknown dialect is refused at once", async () => {
  await assert.rejects(connect(URL_, { dialect: "klingon", WebSocket: class {} }), TypeError);
});
