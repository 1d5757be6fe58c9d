// The state machine alone (SessionCore: no socket, no clock), as
// tests/client/test_state.py drives the Python one: time is a number, server events
// go in, frames come out.

import assert from "node:assert/strict";
import { test } from "node:test";

import { ProtocolViolation, ResumeRefused, SessionCore } from "../src/trio-duplex.js";

const ACKS = { everyEvents: 3, everyBytes: 1 << 20, maxDelayMs: 500 };
const HEARTBEAT = { intervalMs: 15000, timeoutMs: 10000, confirmEvery: 64 };
const CREATED = {
  type: "session.created",
  session_id: "sess_1",
  session: {},
  resume_token: "t1",
  attachment_generation: 1,
  limits: { disconnect_grace_s: 30, idle_ttl_s: 300, journal_max_bytes: 8 << 20, max_event_bytes: 1000 },
};

function opened(now = 0) {
  const core = new SessionCore({}, ACKS, HEARTBEAT, null);
  assert.deepEqual(JSON.parse(core.openingFrame()), { type: "session.update", session: {} });
  core.onHandshake(CREATED, now);
  return core;
}

/** Every frame due at `now`, parsed (binary ones as they are). */
function drain(core, now) {
  const frames = [];
  for (let frame = core.nextFrame(now); frame !== null; frame = core.nextFrame(now)) {
    frames.push(typeof frame === "string" ? JSON.parse(frame) : frame);
  }
  return frames;
}

const delta = (seq) => ({ type: "response.output_text.delta", text: `${seq}`, server_event_seq: seq });

test("a server event at or below the highest seq received is a duplicate, whatever comes between", () => {
  const core = opened();
  assert.deepEqual([1, 2, 3].map((seq) => core.onEvent(delta(seq), 10, 0)), ["deliver", "deliver", "deliver"]);
  assert.equal(core.onEvent(delta(2), 10, 0), "duplicate");
  assert.equal(core.onEvent(delta(3), 10, 0), "duplicate");
  assert.equal(core.onEvent(delta(4), 10, 0), "deliver");
  assert.equal(core.onEvent(delta(1), 10, 0), "duplicate");
  assert.equal(core.lastReceivedSeq, 4);
  // Control events have no seq: never deduplicated.
  const away = { type: "session.going_away", time_left_ms: 5000 };
  assert.deepEqual([core.onEvent(away, 10, 0), core.onEvent(away, 10, 0)], ["deliver", "deliver"]);
});

test("a new session's first frame speaks (a heartbeat if nothing else); acks after everyEvents or maxDelayMs", () => {
  const core = opened();
  assert.deepEqual(drain(core, 0), [{ type: "session.heartbeat" }]);
  core.onEvent(delta(1), 10, 100);
  core.onEvent(delta(2), 10, 100);
  assert.deepEqual(drain(core, 100), []); // 2 unacked, under both bounds
  assert.equal(core.nextDeadline(), 600); // the oldest unacked + maxDelayMs
  assert.deepEqual(drain(core, 600), [{ type: "session.event_ack", server_event_seq: 2 }]);
  for (const seq of [3, 4, 5]) core.onEvent(delta(seq), 10, 700);
  assert.deepEqual(drain(core, 700), [{ type: "session.event_ack", server_event_seq: 5 }]);
});

test("sent events stay in the resend buffer until a heartbeat_ack confirms them; a resume resends the rest", () => {
  const core = opened();
  drain(core, 0);
  for (const text of ["a", "b", "c"]) core.enqueue({ type: "input.text.append", text });
  assert.deepEqual(
    drain(core, 1).map((f) => [f.client_event_seq, f.text]),
    [
      [1, "a"],
      [2, "b"],
      [3, "c"],
    ],
  );
  core.requestConfirm();
  assert.deepEqual(drain(core, 2), [{ type: "session.heartbeat" }]);
  core.onEvent({ type: "session.heartbeat_ack" }, 10, 3); // the hello's: confirms nothing sent
  assert.equal(core.outbox.length, 3);
  core.onEvent({ type: "session.heartbeat_ack" }, 10, 3);
  assert.equal(core.outbox.length, 0);
  core.enqueue({ type: "input.text.append", text: "d" });
  core.enqueue({ type: "input.text.append", text: "e" });
  drain(core, 4); // lost with the connection
  // The resume: the server had read up to 4; only 5 goes again.
  assert.equal(JSON.parse(core.openingFrame()).last_received_server_event_seq, 0);
  core.onHandshake(
    { type: "session.resumed", session_id: "sess_1", resume_token: "t2", attachment_generation: 2, last_received_client_event_seq: 4 },
    5,
  );
  assert.deepEqual(
    drain(core, 5).map((f) => [f.type, f.client_event_seq]),
    [["input.text.append", 5]],
  );
  assert.equal(core.resumeToken, "t2");
});

test("no heartbeat_ack within the timeout: overdue", () => {
  const core = opened();
  drain(core, 0); // the hello heartbeat, at 0
  assert.equal(core.heartbeatOverdue(9999), false);
  assert.equal(core.heartbeatOverdue(10000), true);
});

test("a backpressure refusal rewinds: resend from the refused seq, drop the stale answers", () => {
  const core = opened();
  drain(core, 0);
  for (let i = 1; i <= 4; i++) core.enqueue({ type: "input.text.append", text: `${i}` });
  drain(core, 1);
  const refusal = (code, seq, expected) => ({ type: "error", code, client_event_seq: seq, expected_client_event_seq: expected, retryable: true });
  assert.equal(core.onEvent(refusal("input_backpressure", 2, 2), 10, 1), "internal");
  for (const seq of [3, 4]) assert.equal(core.onEvent(refusal("unexpected_client_event_seq", seq, 2), 10, 1), "internal");
  assert.deepEqual(drain(core, 1), []); // backoff first
  assert.deepEqual(
    drain(core, 51).map((f) => f.client_event_seq),
    [2, 3, 4],
  );
  assert.equal(core.rewinds, 1);
  // A refusal for good is the application's.
  assert.equal(core.onEvent({ type: "error", code: "bad_event", client_event_seq: 3 }, 10, 60), "deliver");
  assert.throws(() => core.onEvent(refusal("input_backpressure", 9, 9), 10, 60), ProtocolViolation);
});

test("input flow control: no room at the server's max_pending_input until input.consumed", () => {
  const core = new SessionCore({}, ACKS, HEARTBEAT, null);
  core.openingFrame();
  core.onHandshake({ ...CREATED, limits: { ...CREATED.limits, max_pending_input: 2, max_pending_input_bytes: 1 << 20 } }, 0);
  core.enqueue({ type: "input.text.append", text: "1" });
  assert.equal(core.hasRoom(100, 1 << 20), true);
  core.enqueue({ type: "input.text.append", text: "2" });
  assert.equal(core.hasRoom(100, 1 << 20), false);
  assert.equal(core.onEvent({ type: "input.consumed", consumed_client_event_seq: 1 }, 10, 1), "internal");
  assert.equal(core.hasRoom(100, 1 << 20), true);
});

test("binary lane: input audio becomes a kind-1 message with its seq", () => {
  const core = new SessionCore({ audio: { wire: "binary" } }, ACKS, HEARTBEAT, null);
  core.openingFrame();
  core.onHandshake({ ...CREATED, session: { audio: { wire: "binary" } } }, 0);
  drain(core, 0);
  core.enqueue({ type: "input_audio_buffer.append", audio: new Uint8Array([9, 8, 7]) });
  const [message] = drain(core, 1);
  assert.ok(message instanceof Uint8Array);
  assert.deepEqual([...message], [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 9, 8, 7]);
});

test("a resume refusal of the session is terminal", () => {
  const core = new SessionCore({}, ACKS, HEARTBEAT, { sessionId: "sess_1", resumeToken: "t", lastServerEventSeq: 7 });
  assert.equal(JSON.parse(core.openingFrame()).last_received_server_event_seq, 7);
  assert.throws(
    () => core.onHandshake({ type: "error", code: "session_resume_expired", message: "gone" }, 0),
    (e) => e instanceof ResumeRefused && e.code === "session_resume_expired",
  );
});
