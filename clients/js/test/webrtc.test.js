// transport "webrtc" (webrtc(), docs/webrtc.md) with a peer connection and a fetch
// played by the test: the offer POSTed with the credential as a bearer, the session on
// the oai-events data channel, a lost peer connection resumed by a new call whose POST
// carries the resume's query and token, audio refused on the data channel. (A real
// browser against a real server: tests/browser/test_calls.py.)

import assert from "node:assert/strict";
import { test } from "node:test";

import { connect, webrtc } from "../src/trio-duplex.js";

const URL_ = "http://h:1/v1/realtime/calls?model=x";
const CREATED = {
  type: "session.created",
  event_id: "event_x1",
  session: { type: "realtime", object: "realtime.session", id: "s1" },
  resume: {
    session_id: "s1",
    resume_token: "t1",
    attachment_generation: 1,
    limits: { disconnect_grace_s: 30, idle_ttl_s: 300, journal_max_bytes: 8 << 20, max_event_bytes: 100000 },
  },
};
const RESUMED = {
  type: "session.resumed",
  event_id: "event_x2",
  session_id: "s1",
  resume_token: "t2",
  attachment_generation: 2,
  last_received_client_event_seq: 1,
};

class FakeChannel {
  constructor(label) {
    this.label = label;
    this.sent = [];
    this.onopen = this.onmessage = this.onclose = null;
  }
  send(data) {
    this.sent.push(data);
  }
  open() {
    this.onopen?.();
  }
  deliver(event) {
    this.onmessage?.({ data: JSON.stringify(event) });
  }
}

/** Every peer connection made, in order. */
const made = [];

class FakePeerConnection {
  constructor(configuration) {
    this.configuration = configuration;
    this.connectionState = "new";
    this.tracks = [];
    this.transceivers = [];
    this.remote = null;
    this.closed = false;
    this.onconnectionstatechange = this.ontrack = null;
    made.push(this);
  }
  createDataChannel(label) {
    this.dc = new FakeChannel(label);
    return this.dc;
  }
  addTrack(track, stream) {
    this.tracks.push(track);
  }
  addTransceiver(kind, init) {
    this.transceivers.push([kind, init.direction]);
  }
  async createOffer() {
    return { type: "offer", sdp: `v=0\r\no=- ${made.length} 2 IN IP4 127.0.0.1\r\n` };
  }
  async setLocalDescription(description) {
    this.localDescription = description;
  }
  async setRemoteDescription(description) {
    this.remote = description;
  }
  fail() {
    this.connectionState = "failed";
    this.onconnectionstatechange?.();
  }
  close() {
    this.closed = true;
  }
}

/** A fetch that answers 201 with an answer naming the call, and records each request. */
function fakeFetch(requests, status = 201) {
  return async (url, init) => {
    requests.push({ url: new URL(url), ...init });
    if (status !== 201) {
      return new Response(JSON.stringify({ error: { message: "no", type: "invalid_request_error" } }), { status });
    }
    const id = `rtc_${String(requests.length).padStart(32, "0")}`;
    return new Response(`v=0\r\nanswer ${requests.length}\r\n`, {
      status: 201,
      headers: { "Content-Type": "application/sdp", Location: `/v1/realtime/calls/${id}` },
    });
  };
}

async function until(test) {
  for (let i = 0; i < 1000 && !test(); i++) await new Promise((resolve) => setImmediate(resolve));
  assert.ok(test(), "never happened");
}

test("webrtc: a call is a connection: offer POSTed, events on oai-events, resumed by a new call", async () => {
  made.length = 0;
  const requests = [];
  const mic = { id: "mic" };
  const tracks = [];
  const pending = connect(URL_, {
    transport: "webrtc",
    dialect: "openai",
    token: "ek_secret",
    mediaStream: { getAudioTracks: () => [mic] },
    onTrack: (track) => tracks.push(track),
    RTCPeerConnection: FakePeerConnection,
    fetch: fakeFetch(requests),
    reconnect: { baseDelayMs: 1, maxDelayMs: 2, maxAttempts: 5 },
  });
  await until(() => made.length === 1 && made[0].remote !== null);
  const [first] = made;
  assert.equal(first.dc.label, "oai-events");
  assert.deepEqual(first.tracks, [mic]);
  const [post] = requests;
  assert.equal(post.method, "POST");
  assert.equal(post.headers["Content-Type"], "application/sdp");
  assert.equal(post.headers.Authorization, "Bearer ek_secret");
  assert.equal(post.body, first.localDescription.sdp);
  assert.equal(post.url.searchParams.get("resume"), null);
  assert.deepEqual(first.remote, { type: "answer", sdp: "v=0\r\nanswer 1\r\n" });
  first.ontrack({ track: "their audio", streams: [] });
  assert.deepEqual(tracks, ["their audio"]);
  first.dc.open();
  first.dc.deliver(CREATED);
  const session = await pending;
  assert.equal(session.sessionId, "s1");
  session.send({ type: "response.create" });
  await until(() => first.dc.sent.some((f) => f.includes("response.create")));
  const sent = first.dc.sent.map((f) => JSON.parse(f)).find((e) => e.type === "response.create");
  assert.equal(sent.client_event_seq, 1);
  await assert.rejects(session.sendAudio(new Uint8Array(4)), TypeError);
  first.dc.deliver({ type: "response.done", server_event_seq: 4 });
  // The peer connection fails: a new call resumes the session.
  first.fail();
  assert.ok(first.closed);
  await until(() => made.length === 2 && made[1].remote !== null);
  const resume = requests[1];
  assert.equal(resume.url.searchParams.get("resume"), "s1");
  assert.equal(resume.url.searchParams.get("last_received_server_event_seq"), "4");
  assert.equal(resume.url.searchParams.get("model"), "x");
  assert.equal(resume.headers.Authorization, "Bearer t1"); // the resume token, not the secret
  made[1].dc.open();
  made[1].dc.deliver(RESUMED);
  await until(() => session.state === "attached");
  assert.equal(session.stats.resumes, 1);
  session.detach();
});

test("webrtc: a refused call is a failed attempt, and the transport needs the OpenAI dialect", async () => {
  made.length = 0;
  const requests = [];
  await assert.rejects(
    connect(URL_, {
      transport: "webrtc",
      dialect: "openai",
      RTCPeerConnection: FakePeerConnection,
      fetch: fakeFetch(requests, 401),
      reconnect: { baseDelayMs: 1, maxDelayMs: 2, maxAttempts: 2, deadlineMs: 1000 },
    }),
  );
  assert.ok(requests.length >= 1 && made.every((pc) => pc.closed));
  assert.deepEqual(made[0].transceivers, [["audio", "recvonly"]]); // no microphone: receive only
  assert.equal(requests[0].headers.Authorization, undefined);
  await assert.rejects(connect(URL_, { transport: "webrtc", RTCPeerConnection: FakePeerConnection }), TypeError);
  assert.throws(() => webrtc({ RTCPeerConnection: undefined, fetch: undefined }), TypeError);
});
