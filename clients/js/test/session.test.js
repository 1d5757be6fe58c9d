// The client against a real `trio-duplex serve` (echo engine): open, send, receive,
// close, detach and resume, a dropped connection, the binary audio lane, and the
// terminal errors.

import assert from "node:assert/strict";
import { before, test } from "node:test";

import {
  EventTooLarge,
  ReconnectFailed,
  ResumeRefused,
  ServerRefused,
  SessionEnded,
  SessionReplaced,
  audioBytes,
  connect,
} from "../src/trio-duplex.js";
import { echoUrl, startServer, until } from "./helpers.js";

let URL_;
before(async () => {
  URL_ = await echoUrl();
});

const text = (value) => ({ type: "input.text.append", text: value });
const FAST = { baseDelayMs: 10, maxDelayMs: 50 };

/** The next `count` events, as the application receives them. */
async function take(session, count) {
  const events = [];
  while (events.length < count) events.push(await session.receive());
  return events;
}

test("open, send, receive in order; close waits for session.closed", async () => {
  const changes = [];
  const session = await connect(URL_, { session: { voice: "alto" }, onChange: (c) => changes.push(c) });
  assert.equal(session.state, "attached");
  assert.match(session.sessionId, /^sess_/);
  assert.equal(session.generation, 1);
  assert.equal(session.config.voice, "alto");
  assert.equal(typeof session.limits.max_event_bytes, "number");
  const seqs = [];
  for (let i = 1; i <= 50; i++) seqs.push(await session.send(text(`m${i}`)));
  assert.deepEqual(seqs, Array.from({ length: 50 }, (_, i) => i + 1));
  const events = await take(session, 50);
  assert.deepEqual(
    events.map((e) => [e.type, e.server_event_seq, e.text]),
    Array.from({ length: 50 }, (_, i) => ["response.output_text.delta", i + 1, `m${i + 1}`]),
  );
  await session.close();
  assert.equal(session.state, "closed");
  const closed = await session.receive();
  assert.equal(closed.type, "session.closed");
  assert.equal(closed.reason, "client_close");
  await assert.rejects(session.receive(), SessionEnded);
  await assert.rejects(session.send(text("late")), SessionEnded);
  assert.deepEqual(
    changes.filter((c) => c.kind === "state").map((c) => c.state),
    ["attached", "closing", "closed"],
  );
  assert.equal(session.stats.eventsReceived, 51);
  assert.equal(session.stats.eventsSent, 50);
});

test("async iteration ends after the terminal event", async () => {
  const session = await connect(URL_);
  await session.send(text("one"));
  const seen = [];
  for await (const event of session) {
    seen.push(event.type);
    if (event.type === "response.output_text.delta") void session.close();
  }
  assert.deepEqual(seen, ["response.output_text.delta", "session.closed"]);
});

test("send refuses what the client sends itself, and stamped events", async () => {
  const session = await connect(URL_);
  await assert.rejects(session.send({ type: "session.heartbeat" }), TypeError);
  await assert.rejects(session.send({ type: "input.text.append", text: "x", client_event_seq: 9 }), TypeError);
  await assert.rejects(session.send({ text: "no type" }), TypeError);
  assert.equal(await session.send(text("still one")), 1); // nothing was spent
  await session.close();
});

test("dropConnection: the client resumes by itself, nothing lost or repeated", async () => {
  const changes = [];
  const session = await connect(URL_, { reconnect: FAST, onChange: (c) => changes.push(c) });
  for (let i = 1; i <= 20; i++) await session.send(text(`a${i}`));
  const first = await take(session, 5);
  session.dropConnection(); // 15 echoes may be in flight: the replay brings them again
  for (let i = 1; i <= 20; i++) await session.send(text(`b${i}`));
  const rest = await take(session, 35);
  const all = [...first, ...rest];
  assert.deepEqual(
    all.map((e) => e.server_event_seq),
    Array.from({ length: 40 }, (_, i) => i + 1),
  );
  assert.deepEqual(
    all.map((e) => e.text),
    [...Array.from({ length: 20 }, (_, i) => `a${i + 1}`), ...Array.from({ length: 20 }, (_, i) => `b${i + 1}`)],
  );
  assert.equal(session.generation, 2);
  assert.equal(session.stats.resumes, 1);
  const states = changes.filter((c) => c.kind === "state").map((c) => c.state);
  assert.deepEqual(states, ["attached", "detached", "resuming", "attached"]);
  const attached = changes.filter((c) => c.kind === "attached");
  assert.deepEqual(
    attached.map((c) => [c.generation, c.resumed]),
    [
      [1, false],
      [2, true],
    ],
  );
  await session.close();
});

test("replayedEvents counts the events a resume's replay brought", async () => {
  // No ack before the takeover: the journal keeps all 30 for the replay.
  const session = await connect(URL_, { acks: { everyEvents: 1000, maxDelayMs: 60000 } });
  const stale = session.resumeState(); // seq 0: everything after it will be replayed
  for (let i = 1; i <= 30; i++) await session.send(text(`r${i}`));
  await take(session, 30); // all 30 are sequenced
  const again = await connect(URL_, { resume: stale }); // a takeover, from seq 0
  const replayed = await take(again, 30);
  assert.deepEqual(
    replayed.map((e) => [e.server_event_seq, e.text]),
    Array.from({ length: 30 }, (_, i) => [i + 1, `r${i + 1}`]),
  );
  assert.equal(again.stats.replayedEvents, 30);
  assert.equal(again.stats.resumes, 1);
  assert.equal(session.stats.replayedEvents, 0);
  await again.send(text("live"));
  await take(again, 1);
  assert.equal(again.stats.replayedEvents, 30); // a live event is not a replayed one
  await again.close();
});

test("detach returns a resume state that a new connect continues, after a JSON round trip", async () => {
  const session = await connect(URL_, { session: { voice: "x" } });
  await session.send(text("first"));
  await take(session, 1);
  await session.send(text("second"));
  await session.confirm(); // the server has it; its echo may or may not have arrived
  const stored = JSON.stringify(await session.detach()); // e.g. into sessionStorage
  assert.equal(session.state, "detached");
  await assert.rejects(session.send(text("after detach")), SessionEnded);
  // What had arrived stays readable; the resume starts after it.
  const early = [];
  for await (const event of session) early.push(event);
  const state = JSON.parse(stored);
  assert.equal(state.sessionId, session.sessionId);
  assert.equal(state.lastServerEventSeq, 1 + early.length);

  const resumed = await connect(URL_, { resume: state });
  assert.equal(resumed.sessionId, session.sessionId);
  assert.equal(resumed.generation, 2);
  assert.equal(resumed.config.voice, "x");
  const late = await take(resumed, 1 - early.length);
  assert.deepEqual(
    [...early, ...late].map((e) => [e.server_event_seq, e.text]),
    [[2, "second"]],
  );
  // Numbering goes on after the server's count (2 events received).
  assert.equal(await resumed.send(text("third")), 3);
  const [third] = await take(resumed, 1);
  assert.deepEqual([third.server_event_seq, third.text], [3, "third"]);
  await resumed.close();
});

test("the binary audio lane: sendAudio and audio events with their bytes", async () => {
  const pcm = { format: "pcm16", rate: 24000 };
  const session = await connect(URL_, { audio: { wire: "binary", input: pcm, output: pcm }, reconnect: FAST });
  assert.deepEqual(session.config.audio, { wire: "binary", input: pcm, output: pcm });
  const chunks = [];
  for (let i = 0; i < 10; i++) {
    const chunk = new Uint8Array(480 + 2 * i);
    for (let j = 0; j < chunk.length; j++) chunk[j] = (i * 7 + j) & 0xff;
    chunks.push(chunk);
    assert.equal(await session.sendAudio(i % 2 ? chunk.buffer : chunk), i + 1);
    if (i === 4) session.dropConnection(); // the binary lane resumes like the rest
  }
  const events = await take(session, 10);
  for (const [i, event] of events.entries()) {
    assert.equal(event.type, "response.output_audio.delta");
    assert.equal(event.server_event_seq, i + 1);
    assert.ok(event.audio instanceof Uint8Array); // a binary message, not base64
    assert.deepEqual(audioBytes(event), chunks[i]);
  }
  const total = chunks.reduce((n, c) => n + c.length, 0);
  assert.equal(session.stats.audioBytesSent, total);
  assert.equal(session.stats.audioBytesReceived, total);
  await session.close();
});

test("audio on the JSON lane goes as base64 and comes back as base64", async () => {
  const session = await connect(URL_);
  const chunk = new Uint8Array([1, 2, 3, 4, 250, 251]);
  await session.sendAudio(chunk);
  const [event] = await take(session, 1);
  assert.equal(typeof event.audio, "string");
  assert.deepEqual(audioBytes(event), chunk);
  await session.close();
});

test("resume of an unknown or closed session: ResumeRefused", async () => {
  const session = await connect(URL_);
  const state = session.resumeState();
  await session.close();
  for (const resume of [state, { ...state, sessionId: "sess_000000000000000000000000" }]) {
    const error = await connect(URL_, { resume }).then(
      () => assert.fail("resumed"),
      (e) => e,
    );
    assert.ok(error instanceof ResumeRefused, String(error));
    assert.equal(error.code, "session_resume_expired");
    assert.equal(error.closeCode, 4001);
  }
});

test("a wrong resume token: ResumeRefused invalid_resume_token", async () => {
  const session = await connect(URL_);
  const state = { ...(await session.detach()), resumeToken: "not-the-token" };
  await assert.rejects(connect(URL_, { resume: state }), (e) => e instanceof ResumeRefused && e.code === "invalid_resume_token");
});

test("an open the server refuses: ServerRefused with its code", async () => {
  const bad = { wire: "binary", input: { format: "pcm16", rate: 12345 } };
  await assert.rejects(
    connect(URL_, { audio: bad }),
    (e) => e instanceof ServerRefused && e.code === "unsupported_audio_format" && !e.retryable,
  );
});

test("no server there: ReconnectFailed after the bounded attempts", async () => {
  const changes = [];
  const error = await connect("ws://127.0.0.1:9/v1/duplex", {
    reconnect: { maxAttempts: 3, baseDelayMs: 1, maxDelayMs: 2 },
    onChange: (c) => changes.push(c),
  }).then(
    () => assert.fail("connected"),
    (e) => e,
  );
  assert.ok(error instanceof ReconnectFailed, String(error));
  assert.equal(error.attempts, 3);
  assert.deepEqual(
    changes.filter((c) => c.kind === "retrying").map((c) => c.attempt),
    [1, 2],
  );
});

test("another connection resumes the session: SessionReplaced", async () => {
  const session = await connect(URL_);
  await session.send(text("mine"));
  await take(session, 1);
  const thief = await connect(URL_, { resume: session.resumeState() });
  const replaced = await session.receive();
  assert.equal(replaced.type, "session.replaced");
  await assert.rejects(session.receive(), (e) => e instanceof SessionReplaced && e.generation === 2);
  assert.equal(session.state, "failed");
  assert.ok(session.error instanceof SessionReplaced);
  await assert.rejects(session.send(text("x")), SessionReplaced);
  await thief.send(text("theirs"));
  const [echo] = await take(thief, 1);
  assert.deepEqual([echo.server_event_seq, echo.text], [2, "theirs"]);
  await thief.close();
});

test("state changes are also 'change' events on the session (EventTarget)", async () => {
  const session = await connect(URL_, { reconnect: FAST });
  const seen = [];
  session.addEventListener("change", (e) => seen.push(e.detail.kind));
  session.dropConnection();
  await until(() => seen.includes("attached"), "the resume");
  assert.deepEqual(seen.slice(0, 2), ["state", "disconnected"]);
  await session.close();
});

test("an event over the server's max_event_bytes: EventTooLarge, nothing queued", async () => {
  const session = await connect(URL_);
  const limit = session.limits.max_event_bytes;
  await assert.rejects(
    session.send(text("x".repeat(limit))),
    (e) => e instanceof EventTooLarge && e.limit === limit && e.size > limit,
  );
  assert.equal(await session.send(text("small")), 1);
  await session.close();
});

test("a draining server: session.going_away is delivered and reported, then session.closed", async () => {
  const { url, proc } = await startServer(["--drain-timeout", "0.5"]);
  const changes = [];
  const session = await connect(url, { onChange: (c) => changes.push(c) });
  await session.send(text("before the drain"));
  await take(session, 1);
  proc.kill("SIGINT");
  const away = await session.receive();
  assert.equal(away.type, "session.going_away");
  assert.equal(typeof away.time_left_ms, "number");
  const going = changes.find((c) => c.kind === "going_away");
  assert.deepEqual([going.migrating, going.timeLeftMs], [false, away.time_left_ms]);
  const closed = await session.receive();
  assert.deepEqual([closed.type, closed.reason], ["session.closed", "server_shutdown"]);
  await assert.rejects(session.receive(), SessionEnded);
  assert.equal(session.state, "closed");
});

test("options that cannot work are refused at once", async () => {
  await assert.rejects(connect(URL_, { token: "has space" }), TypeError);
  await assert.rejects(connect(URL_, { resume: { sessionId: "s" } }), TypeError);
  await assert.rejects(connect(URL_, { resume: { sessionId: "s", resumeToken: "t", lastServerEventSeq: 0 }, session: {} }), TypeError);
  await assert.rejects(connect([URL_, URL_.replace(/^ws/, "wss")]), TypeError);
  await assert.rejects(connect([]), TypeError);
  await assert.rejects(connect(URL_, { reconnect: { maxAttempts: 0 } }), RangeError);
  await assert.rejects(connect("not a url"), (e) => e instanceof ServerRefused && /cannot open a WebSocket/.test(e.message));
});
