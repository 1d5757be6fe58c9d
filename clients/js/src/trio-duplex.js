// trio-duplex.js: the JavaScript client of trio-duplex (docs/protocol.md, protocol v2).
//
// One resumable session over any number of WebSocket connections, with the guarantees
// of the Python client (trio_duplex/client, docs/client.md): every server event with a
// server_event_seq is delivered once and in order across reconnects; every event given
// to send() is stamped with client_event_seq and kept until the server is known to have
// read it, and after a resume exactly the unconfirmed rest is sent again.
//
// One file, no dependencies, no build step: it runs from a <script type="module"> and
// under Node >= 20 (with --experimental-websocket, or a WebSocket constructor given in
// the options). Its layout mirrors the Python client's: `Core` is the protocol state
// machine with no I/O and no clock (trio_duplex/client/state.py: time comes in as
// `now`, frames go out as text or bytes), `UrlRing` which URL each attempt uses
// (urls.py), and `Session` the shell that owns the sockets and timers (session.py).
// Public API and its types: trio-duplex.d.ts; documentation: docs/browser.md.

/** @typedef {{type: string, [field: string]: any}} DuplexEvent */

const MiB = 1024 * 1024;

const T = Object.freeze({
  UPDATE: "session.update",
  RESUME: "session.resume",
  EVENT_ACK: "session.event_ack",
  HEARTBEAT: "session.heartbeat",
  CLOSE: "session.close",
  CREATED: "session.created",
  RESUMED: "session.resumed",
  UPDATED: "session.updated",
  REPLACED: "session.replaced",
  HEARTBEAT_ACK: "session.heartbeat_ack",
  GOING_AWAY: "session.going_away",
  CLOSED: "session.closed",
  EXPIRED: "session.expired",
  ERROR: "error",
  INPUT_CONSUMED: "input.consumed",
  INPUT_AUDIO_APPEND: "input_audio_buffer.append",
  OUTPUT_AUDIO_DELTA: "response.output_audio.delta",
});

/** Client events a client library sends itself (never on the application's behalf). */
/** @type {Set<string>} */
const MANAGED_EVENTS = new Set([T.RESUME, T.HEARTBEAT, T.EVENT_ACK, T.CLOSE]);
/** The events that end a session: exactly one per session, and nothing after it. */
/** @type {Set<string>} */
const TERMINAL_EVENTS = new Set([T.CLOSED, T.EXPIRED]);
const RESUME_REFUSALS = new Set([
  "session_resume_expired",
  "invalid_resume_token",
  "invalid_session_resume",
]);
/** Retryable refusals of one of our events: resend from the seq the server expects. */
const RESEND_CODES = new Set(["input_backpressure", "unexpected_client_event_seq"]);
/** After such a refusal: resend after this many ms, doubled on each refusal up to the
 * second figure, or as soon as an input.consumed report shows room was made. */
const RESEND_BACKOFF = [50, 1000];

const CLOSE_GOING_AWAY = 1001;
const CLOSE_RESUME_REFUSED = 4001;

// -- errors (trio_duplex/client/errors.py) ---------------------------------------------

/** Base of every error the client raises about the session or the server. */
export class ClientError extends Error {
  /** @param {string} [message] */
  constructor(message) {
    super(message);
    this.name = new.target.name;
  }
}

/** The server answered the open or resume with error{code} (or a refusing close). */
export class ServerRefused extends ClientError {
  /**
   * @param {string | null} code
   * @param {string} message
   * @param {{closeCode?: number | null, retryable?: boolean, reason?: string | null}} [options]
   */
  constructor(code, message, options = {}) {
    const reason = options.reason ?? null;
    let text = message;
    if (code !== null) text = `${code}${reason !== null ? ` (${reason})` : ""}: ${message}`;
    else if (options.closeCode != null) text = `closed ${options.closeCode}: ${message}`;
    super(text);
    this.code = code;
    this.closeCode = options.closeCode ?? null;
    /** The server said the same request may succeed later (error.retryable). */
    this.retryable = options.retryable ?? false;
    this.reason = reason;
  }
}

/** A terminal resume refusal (session_resume_expired, invalid_resume_token,
 * invalid_session_resume, or close 4001): the session cannot be resumed again. */
export class ResumeRefused extends ServerRefused {}

/** Another connection resumed this session (session.replaced, close 4000). */
export class SessionReplaced extends ClientError {
  /** @param {number | null} generation */
  constructor(generation) {
    super(`session taken over by attachment generation ${generation}`);
    this.generation = generation;
  }
}

/** No connection could be (re)established within the attempts or the deadline. */
export class ReconnectFailed extends ClientError {
  /** @param {number} attempts @param {number} elapsedMs @param {string} lastError */
  constructor(attempts, elapsedMs, lastError) {
    super(`gave up after ${attempts} attempts in ${(elapsedMs / 1000).toFixed(1)}s: ${lastError}`);
    this.attempts = attempts;
    this.elapsedMs = elapsedMs;
    this.lastError = lastError;
  }
}

/** The session is over (closed, expired, closing or detached). */
export class SessionEnded extends ClientError {
  /** @param {DuplexEvent | null} [event] the terminal event, when one arrived */
  constructor(event = null) {
    super(
      event === null
        ? "the session has ended"
        : `the session has ended: ${event.type} (${event.reason})`,
    );
    this.event = event;
  }
}

/** The server broke docs/protocol.md. */
export class ProtocolViolation extends ClientError {}

/** An event would exceed the server's max_event_bytes; it was not queued. */
export class EventTooLarge extends ClientError {
  /** @param {number} size @param {number} limit */
  constructor(size, limit) {
    super(`event is ${size} bytes, the server accepts at most ${limit}`);
    this.size = size;
    this.limit = limit;
  }
}

/** One connection attempt failed in a way that another attempt might not. */
class AttemptFailed extends Error {
  /** @param {string} message @param {boolean} [draining] */
  constructor(message, draining = false) {
    super(message);
    /** The server said it is shutting down (server_shutting_down, close 1001). */
    this.draining = draining;
  }
}

// -- wire helpers -----------------------------------------------------------------------


/** @param {string} text */
function utf8Len(text) {
  let n = text.length;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c >= 0x80) {
      if (c < 0x800) n += 1;
      else if (c >= 0xd800 && c < 0xdc00) i++, n += 2; // a surrogate pair: 4 bytes in all
      else n += 2;
    }
  }
  return n;
}

/** @param {string} text @returns {DuplexEvent | null} */
function parseEvent(text) {
  let event;
  try {
    event = JSON.parse(text);
  } catch {
    return null;
  }
  if (event === null || typeof event !== "object" || Array.isArray(event)) return null;
  return typeof event.type === "string" ? event : null;
}

const HEADER_SIZE = 12;
const INPUT_AUDIO = 1;
const OUTPUT_AUDIO = 2;

/** A kind-1 binary message: input audio with client_event_seq `seq`. */
function inputMessage(/** @type {number} */ seq, /** @type {Uint8Array} */ payload) {
  const message = new Uint8Array(HEADER_SIZE + payload.length);
  const view = new DataView(message.buffer);
  view.setUint8(0, INPUT_AUDIO);
  view.setBigUint64(4, BigInt(seq));
  message.set(payload, HEADER_SIZE);
  return message;
}

/** A binary message from the server as the event it stands for (a kind-2 message is
 * response.output_audio.delta with its seq and the payload as `field`: the dialect's
 * name for it), or null. */
function audioEvent(/** @type {ArrayBuffer} */ data, field = "audio") {
  if (data.byteLength < HEADER_SIZE) return null;
  const view = new DataView(data);
  if (view.getUint8(0) !== OUTPUT_AUDIO || view.getUint8(1) !== 0 || view.getUint16(2) !== 0) {
    return null;
  }
  const seq = Number(view.getBigUint64(4));
  return {
    type: T.OUTPUT_AUDIO_DELTA,
    server_event_seq: seq,
    [field]: new Uint8Array(data, HEADER_SIZE),
  };
}

/** @param {ArrayBuffer | ArrayBufferView} data */
function toBytes(data) {
  if (data instanceof Uint8Array) return data;
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  throw new TypeError("audio must be an ArrayBuffer or a typed array");
}

/** @param {Uint8Array} bytes */
function base64Encode(bytes) {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(text);
}

/** The audio of an input_audio_buffer.append or response.output_audio.delta as bytes,
 * whichever lane it came on (raw on the binary lane, base64 in JSON) and whichever
 * dialect spelt it (`audio`, or OpenAI's output `delta`); null if it has none or it is
 * not valid base64.
 * @param {DuplexEvent} event @returns {Uint8Array | null} */
export function audioBytes(event) {
  const audio = !("audio" in event) && "delta" in event ? event.delta : event.audio;
  if (audio instanceof Uint8Array) return audio;
  if (typeof audio !== "string" || !/^[A-Za-z0-9+/]*={0,2}$/.test(audio) || audio.length % 4) {
    return null;
  }
  const text = atob(audio);
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
  return bytes;
}

// -- the dialects (trio_duplex/client/dialect.py) ---------------------------------------
//
// What the client reads and writes itself, as each wire spells it; the only place that
// knows the difference. native: /v1/duplex (docs/protocol.md). openai: /v1/realtime, the
// OpenAI Realtime GA wire with our resume extension: the server speaks first (the
// upgrade opens the session; session.created carries a top-level `resume` object), the
// configuration goes out as the session's first (numbered) event, a resume is the
// upgrade `?resume=ID&last_received_server_event_seq=N` with the resume token as the
// credential, errors nest their fields in `error`, output audio is base64 `delta`.

const NATIVE = Object.freeze({
  name: "native",
  /** @param {string | null} credential */
  protocols: (credential) => (credential == null ? ["trio-duplex"] : ["trio-duplex", `trio-duplex.bearer.${credential}`]),
  /** @param {string} url @param {[string, number] | null} resume */
  openingUrl: (url, resume) => url,
  /** @param {Record<string, any>} config @param {[string, string, number] | null} resume
   * @returns {string | null} */
  openingFrame: (config, resume) =>
    resume === null
      ? JSON.stringify({ type: T.UPDATE, session: config })
      : JSON.stringify({
          type: T.RESUME,
          session_id: resume[0],
          resume_token: resume[1],
          last_received_server_event_seq: resume[2],
        }),
  /** @param {Record<string, any>} config @returns {DuplexEvent | null} */
  firstUpdate: (config) => null,
  /** @param {DuplexEvent} event */
  handshake: (event) => ({
    sessionId: event.session_id,
    resumeToken: event.resume_token,
    generation: event.attachment_generation,
    limits: event.limits,
    session: event.session,
  }),
  /** @param {DuplexEvent} event @returns {Record<string, any>} */
  error: (event) => event,
  /** @param {DuplexEvent} event @returns {Record<string, any> | null} */
  fullUpdate: (event) => null, // natively session.updated states the fields an update set
  outputAudioField: "audio",
});

const OPENAI = Object.freeze({
  name: "openai",
  /** @param {string | null} credential */
  protocols: (credential) => (credential == null ? ["realtime"] : ["realtime", `openai-insecure-api-key.${credential}`]),
  /** @param {string} url @param {[string, number] | null} resume */
  openingUrl: (url, resume) => {
    if (resume === null) return url;
    const parsed = new URL(url);
    parsed.searchParams.set("resume", resume[0]);
    parsed.searchParams.set("last_received_server_event_seq", String(resume[1]));
    return parsed.toString();
  },
  /** @param {Record<string, any>} config @param {[string, string, number] | null} resume
   * @returns {string | null} */
  openingFrame: (config, resume) => null, // the upgrade opens (or resumes) the session
  /** @param {Record<string, any>} config @returns {DuplexEvent | null} */
  firstUpdate: (config) =>
    Object.keys(config).length === 0 ? null : { type: T.UPDATE, session: { type: "realtime", ...config } },
  /** @param {DuplexEvent} event */
  handshake: (event) => {
    if (event.type !== T.CREATED) return NATIVE.handshake(event); // session.resumed
    const resume = isObject(event.resume) ? event.resume : {};
    return {
      sessionId: resume.session_id,
      resumeToken: resume.resume_token,
      generation: resume.attachment_generation,
      limits: resume.limits,
      session: event.session,
    };
  },
  /** @param {DuplexEvent} event @returns {Record<string, any>} */
  error: (event) => (isObject(event.error) ? event.error : {}),
  /** @param {DuplexEvent} event @returns {Record<string, any> | null} */
  fullUpdate: (event) => (isObject(event.session) ? event.session : null),
  outputAudioField: "delta",
});

/** @typedef {typeof NATIVE | typeof OPENAI} Dialect */
/** @type {Record<string, Dialect>} */
const DIALECTS = { native: NATIVE, openai: OPENAI };

// -- the state machine (trio_duplex/client/state.py) ------------------------------------

const DELIVER = "deliver";
const DUPLICATE = "duplicate";
/** Consumed by the client (heartbeat_ack, input.consumed, a refusal it resends). */
const INTERNAL = "internal";
/** A terminal event: deliver it; the session is over. */
const END = "end";
/** session.replaced: deliver it; another attachment owns the session now. */
const REPLACED = "replaced";

/** The `limits` of session.created (defaults until the server has said). */
function limitsFrom(/** @type {any} */ value) {
  /** @type {Record<string, any>} */
  const limits = {
    disconnect_grace_s: 30,
    idle_ttl_s: 300,
    journal_max_bytes: 8 * MiB,
    max_event_bytes: 15 * MiB,
  };
  if (value === null || typeof value !== "object") return limits;
  for (const [name, bound] of Object.entries(value)) {
    if (typeof bound === "number" && Number.isFinite(bound) && bound > 0) limits[name] = bound;
  }
  return limits;
}

/** The client half of the protocol: sequence numbers both ways, the unconfirmed outbox
 * (the resend buffer), deduplication, and the ack and heartbeat policies. No I/O, no
 * clock: `now` (ms) comes in, frames (string or Uint8Array) come out of nextFrame.
 * Exported as SessionCore for tests and diagnostics (as trio_duplex.client exports its
 * SessionState); applications use connect(). */
class Core {
  /**
   * @param {Record<string, any>} config
   * @param {{everyEvents: number, everyBytes: number, maxDelayMs: number}} acks
   * @param {{intervalMs: number, timeoutMs: number, confirmEvery: number}} heartbeat
   * @param {{sessionId: string, resumeToken: string, lastServerEventSeq: number} | null} resume
   * @param {string} [dialect] "native" or "openai"
   */
  constructor(config, acks, heartbeat, resume, dialect = "native") {
    if (!Object.hasOwn(DIALECTS, dialect)) {
      throw new TypeError(`dialect must be one of ${Object.keys(DIALECTS).join(", ")}`);
    }
    /** @type {Dialect} */
    this.dialect = DIALECTS[dialect];
    this.config = config;
    this.acks = acks;
    this.heartbeat = heartbeat;
    /** @type {string | null} */
    this.sessionId = resume ? resume.sessionId : null;
    /** @type {string | null} */
    this.resumeToken = resume ? resume.resumeToken : null;
    this.generation = 0;
    this.limits = limitsFrom(null);
    // server -> client
    this.lastReceivedSeq = resume ? resume.lastServerEventSeq : 0;
    this.ackedSeq = this.lastReceivedSeq;
    // client -> server
    /** @type {number} */
    this.nextClientSeq = 1;
    this.confirmedSeq = 0;
    /** @type {{seq: number, frame: string | Uint8Array, size: number}[]} */
    this.outbox = []; // unconfirmed client events, contiguous seqs in order
    this.outboxBytes = 0;
    this.closing = false;
    this.ended = false;
    /** @type {string | null} */
    this.closeReason = null;
    this.unacked = 0;
    this.unackedBytes = 0;
    /** @type {number | null} */
    this.unackedSince = null;
    this.sentThrough = 0;
    /** @type {[number, number][]} outstanding heartbeats: (sent at, last client seq before it) */
    this.heartbeats = [];
    this.lastHeartbeat = 0;
    this.confirmTarget = 0;
    this.closeSent = false;
    this.owesHello = false;
    this.resumeFrom = 0;
    // input flow control (protocol v2): sizes of the events above the consumption reported
    /** @type {number[]} */
    this.unconsumed = [];
    this.unconsumedBytes = 0;
    this.resendAt = -Infinity;
    this.backoff = RESEND_BACKOFF[0];
    this.staleThrough = 0;
    this.rewinds = 0;
    const update = this.sessionId === null ? this.dialect.firstUpdate(config) : null;
    if (update !== null) this.enqueue(update); // (a server that speaks first: the first event)
  }

  get consumedSeq() {
    return this.nextClientSeq - 1 - this.unconsumed.length;
  }

  get ackPending() {
    return this.unacked > 0;
  }

  /** ``json`` or ``binary``: the lane audio travels on. */
  get audioWire() {
    const audio = this.config.audio;
    const wire = audio !== null && typeof audio === "object" ? audio.wire : undefined;
    return typeof wire === "string" ? wire : "json";
  }

  resumeState() {
    if (this.sessionId === null || this.resumeToken === null) return null;
    return {
      sessionId: this.sessionId,
      resumeToken: this.resumeToken,
      lastServerEventSeq: this.lastReceivedSeq,
    };
  }

  /** The URL a connection to `url` dials (the dialect may resume by its query). */
  openingUrl(/** @type {string} */ url) {
    if (this.sessionId === null) return this.dialect.openingUrl(url, null);
    this.resumeFrom = this.lastReceivedSeq;
    return this.dialect.openingUrl(url, [this.sessionId, this.resumeFrom]);
  }

  /** The first frame of a connection: open a session, or resume ours (null: the
   * dialect's server speaks first). @returns {string | null} */
  openingFrame() {
    if (this.sessionId === null) return this.dialect.openingFrame(this.config, null);
    this.resumeFrom = this.lastReceivedSeq;
    const resume = /** @type {[string, string, number]} */ ([this.sessionId, this.resumeToken, this.resumeFrom]);
    return this.dialect.openingFrame(this.config, resume);
  }

  /** The server's first answer. Throws ServerRefused (see .retryable), ResumeRefused or
   * ProtocolViolation. @param {DuplexEvent} event @param {number} now */
  onHandshake(event, now) {
    const kind = event.type;
    const resumed = this.sessionId !== null;
    if (kind === T.ERROR) throw refusal(this.dialect.error(event), resumed);
    const said = this.dialect.handshake(event);
    const token = said.resumeToken;
    const generation = said.generation;
    if (typeof token !== "string" || !Number.isInteger(generation)) {
      throw new ProtocolViolation(`${kind} without resume_token or attachment_generation`);
    }
    if (!resumed) {
      if (kind !== T.CREATED || typeof said.sessionId !== "string") {
        throw new ProtocolViolation(`expected session.created, got ${JSON.stringify(kind)}`);
      }
      this.sessionId = said.sessionId;
      this.limits = limitsFrom(said.limits);
      if (isObject(said.session)) this.config = said.session;
    } else {
      const received = event.last_received_client_event_seq;
      if (kind !== T.RESUMED || said.sessionId !== this.sessionId) {
        throw new ProtocolViolation(`expected session.resumed of ${this.sessionId}`);
      }
      if (!Number.isInteger(received) || received < 0) {
        throw new ProtocolViolation("session.resumed without last_received_client_event_seq");
      }
      if (isObject(said.session)) this.config = said.session;
      // The resume acked everything up to what it claimed.
      this.ackedSeq = Math.max(this.ackedSeq, this.resumeFrom);
      this.unacked = this.unackedBytes = 0;
      this.unackedSince = null;
      // Resumed from another page or process: our numbering continues after the server's.
      if (received + 1 > this.nextClientSeq) {
        this.nextClientSeq = received + 1;
        this.unconsumed = []; // (another process's events: not ours to count)
        this.unconsumedBytes = 0;
      }
      this.confirm(received);
      if (Number.isInteger(event.consumed_client_event_seq)) {
        this.consumed(event.consumed_client_event_seq);
      }
    }
    this.resumeToken = token;
    this.generation = generation;
    this.sentThrough = this.confirmedSeq;
    this.heartbeats = [];
    this.lastHeartbeat = now;
    // A new session: the first frame tells the server we hold its credentials (a
    // session whose client never spoke after session.created is kept only for the short
    // unconfirmed grace); a heartbeat if nothing else goes. A resume shows it.
    this.owesHello = !resumed;
    this.closeSent = false;
    this.staleThrough = 0;
    this.resendAt = -Infinity;
    this.backoff = RESEND_BACKOFF[0];
    return { sessionId: this.sessionId, generation, resumed, resent: this.outbox.length };
  }

  /** Throws TypeError if `event` cannot be sent by the application. */
  static check(/** @type {any} */ event) {
    if (event === null || typeof event !== "object" || typeof event.type !== "string") {
      throw new TypeError("an event needs a string field 'type'");
    }
    if (MANAGED_EVENTS.has(event.type)) {
      throw new TypeError(`${event.type} is sent by the client itself; see Session's methods`);
    }
    if ("client_event_seq" in event) throw new TypeError("client_event_seq is assigned by the client");
  }

  /** Stamp `event` with the next client_event_seq and queue it. Nothing changes if this
   * throws (TypeError, EventTooLarge). @param {DuplexEvent} event */
  enqueue(event) {
    Core.check(event);
    const seq = this.nextClientSeq;
    /** @type {string | Uint8Array} */
    let frame;
    const audio = event.audio;
    if (event.type === T.INPUT_AUDIO_APPEND && (audio instanceof ArrayBuffer || ArrayBuffer.isView(audio))) {
      // Raw audio in the session's input format: a binary message on the binary lane,
      // base64 in JSON on the other.
      const bytes = toBytes(audio);
      if (this.audioWire === "binary") frame = inputMessage(seq, bytes);
      else frame = JSON.stringify({ ...event, audio: base64Encode(bytes), client_event_seq: seq });
    } else {
      frame = JSON.stringify({ ...event, client_event_seq: seq });
    }
    const size = typeof frame === "string" ? utf8Len(frame) : frame.length;
    if (size > this.limits.max_event_bytes) throw new EventTooLarge(size, this.limits.max_event_bytes);
    this.nextClientSeq = seq + 1;
    this.outbox.push({ seq, frame, size });
    this.outboxBytes += size;
    // The server's measure is the message's length (characters; UTF-16 units here,
    // which never undercount them).
    this.unconsumed.push(frame.length);
    this.unconsumedBytes += frame.length;
    return seq;
  }

  /** session.close (with `reason`) goes out after everything already queued. */
  requestClose(/** @type {string | null} */ reason) {
    if (!this.closing && !this.ended) {
      this.closing = true;
      this.closeReason = reason;
    }
  }

  /** Ask for a heartbeat after everything sent so far; returns the seq to wait for. */
  requestConfirm() {
    const target = this.nextClientSeq - 1;
    this.confirmTarget = Math.max(this.confirmTarget, target);
    return target;
  }

  /** A heartbeat is due now (a barrier: see replayedEvents in Session). */
  requestHeartbeat() {
    this.lastHeartbeat = -Infinity;
  }

  /** The next frame to send, or null (then wait for nextDeadline). Taking a frame counts
   * it as sent: a failed send ends the connection, and the next handshake resets what
   * counts as sent. @param {number} now */
  nextFrame(now) {
    let frame = this.#nextFrame(now);
    if (this.owesHello) {
      this.owesHello = false;
      if (frame === null) {
        this.heartbeats.push([now, this.sentThrough]);
        this.lastHeartbeat = now;
        frame = HEARTBEAT_FRAME;
      }
    }
    return frame;
  }

  /** @param {number} now @returns {string | Uint8Array | null} */
  #nextFrame(now) {
    if (this.#ackDue(now)) {
      this.ackedSeq = this.lastReceivedSeq;
      this.unacked = this.unackedBytes = 0;
      this.unackedSince = null;
      return JSON.stringify({ type: T.EVENT_ACK, server_event_seq: this.ackedSeq });
    }
    if (this.#heartbeatDue(now)) {
      this.heartbeats.push([now, this.sentThrough]);
      this.lastHeartbeat = now;
      return HEARTBEAT_FRAME;
    }
    if (now >= this.resendAt) this.resendAt = -Infinity; // a resend's backoff is over
    if (this.outbox.length && this.resendAt === -Infinity) {
      const index = this.sentThrough + 1 - this.outbox[0].seq;
      if (index < this.outbox.length) {
        const item = this.outbox[Math.max(index, 0)];
        this.sentThrough = item.seq;
        return item.frame;
      }
    }
    if (this.closing && !this.closeSent) {
      this.closeSent = true;
      const close = this.closeReason === null ? { type: T.CLOSE } : { type: T.CLOSE, reason: this.closeReason };
      return JSON.stringify(close);
    }
    return null;
  }

  nextDeadline() {
    let deadline = this.lastHeartbeat + this.#heartbeatInterval();
    if (this.heartbeats.length) deadline = Math.min(deadline, this.heartbeats[0][0] + this.heartbeat.timeoutMs);
    if (this.unackedSince !== null) deadline = Math.min(deadline, this.unackedSince + this.acks.maxDelayMs);
    return this.resendAt > -Infinity ? Math.min(deadline, this.resendAt) : deadline;
  }

  heartbeatOverdue(/** @type {number} */ now) {
    return this.heartbeats.length > 0 && now >= this.heartbeats[0][0] + this.heartbeat.timeoutMs;
  }

  /** Room for one more event: the resend buffer is under its bounds, and (protocol v2)
   * the events above the server's last input.consumed report are under its advertised
   * max_pending_input and max_pending_input_bytes (then it never refuses them). */
  hasRoom(/** @type {number} */ maxEvents, /** @type {number} */ maxBytes) {
    if (this.outbox.length >= maxEvents || this.outboxBytes >= maxBytes) return false;
    const bound = this.limits.max_pending_input;
    const bytesBound = this.limits.max_pending_input_bytes;
    return (
      (bound === undefined || this.unconsumed.length < bound) &&
      (bytesBound === undefined || this.unconsumedBytes < bytesBound)
    );
  }

  /** @param {DuplexEvent} event @param {number} size @param {number} now */
  onEvent(event, size, now) {
    const seq = event.server_event_seq;
    if (Number.isInteger(seq)) {
      if (seq <= this.lastReceivedSeq) return DUPLICATE;
      this.lastReceivedSeq = seq;
      this.unacked += 1;
      this.unackedBytes += size;
      if (this.unackedSince === null) this.unackedSince = now;
      if (event.type === T.UPDATED) {
        const whole = this.dialect.fullUpdate(event);
        if (whole !== null) this.config = whole;
      }
      return DELIVER;
    }
    const kind = event.type;
    if (kind === T.INPUT_CONSUMED) {
      if (Number.isInteger(event.consumed_client_event_seq)) {
        this.consumed(event.consumed_client_event_seq);
        this.resendAt = -Infinity; // room was made
        this.backoff = RESEND_BACKOFF[0];
      }
      return INTERNAL;
    }
    if (kind === T.ERROR) {
      const fields = this.dialect.error(event);
      return Number.isInteger(fields.client_event_seq) ? this.#onRefusal(fields, now) : DELIVER;
    }
    if (kind === T.HEARTBEAT_ACK) {
      const heartbeat = this.heartbeats.shift(); // (none: unasked for, nothing to confirm)
      if (heartbeat !== undefined) this.confirm(heartbeat[1]);
      return INTERNAL;
    }
    if (TERMINAL_EVENTS.has(kind)) {
      this.ended = true;
      return END;
    }
    if (kind === T.REPLACED) {
      this.ended = true;
      return REPLACED;
    }
    return DELIVER;
  }

  /** The server consumed every event up to `seq`, so it has read them too. */
  consumed(/** @type {number} */ seq) {
    const drop = Math.min(seq - this.consumedSeq, this.unconsumed.length);
    if (drop > 0) {
      for (const size of this.unconsumed.splice(0, drop)) this.unconsumedBytes -= size;
    }
    this.confirm(seq);
  }

  /** An error naming one of our events (its client_event_seq). A retryable refusal
   * rewinds: every event from the seq the server expects is sent again after a short
   * backoff, and the answers still due to what was sent before (refusals all: nothing
   * may overtake the refused one) are dropped. Other refusals are delivered.
   * @param {Record<string, any>} event @param {number} now */
  #onRefusal(event, now) {
    const refused = event.client_event_seq;
    if (this.staleThrough) {
      if (refused >= this.staleThrough) this.staleThrough = 0;
      return INTERNAL;
    }
    const code = event.code;
    if (!RESEND_CODES.has(code)) return DELIVER;
    const expected = event.expected_client_event_seq ?? refused;
    const first = this.outbox.length ? this.outbox[0].seq : this.nextClientSeq;
    if (!Number.isInteger(expected) || !(first <= expected && expected <= Math.min(refused, this.sentThrough))) {
      throw new ProtocolViolation(
        `${code} asks for client_event_seq ${expected}, which the client cannot resend ` +
          `(it holds ${first} to ${this.nextClientSeq - 1})`,
      );
    }
    if (this.sentThrough > refused) this.staleThrough = this.sentThrough;
    this.sentThrough = expected - 1;
    // A heartbeat sent after the refused events must not confirm them.
    this.heartbeats = this.heartbeats.map(([at, barrier]) => [at, Math.min(barrier, expected - 1)]);
    this.resendAt = now + this.backoff;
    this.backoff = Math.min(this.backoff * 2, RESEND_BACKOFF[1]);
    this.rewinds += 1;
    return INTERNAL;
  }

  confirm(/** @type {number} */ seq) {
    this.confirmedSeq = Math.max(this.confirmedSeq, Math.min(seq, this.nextClientSeq - 1));
    let drop = 0;
    while (drop < this.outbox.length && this.outbox[drop].seq <= this.confirmedSeq) {
      this.outboxBytes -= this.outbox[drop].size;
      drop++;
    }
    if (drop) this.outbox.splice(0, drop);
  }

  #ackDue(/** @type {number} */ now) {
    if (!this.unacked) return false;
    const everyBytes = Math.min(this.acks.everyBytes, Math.max(1, Math.floor(this.limits.journal_max_bytes / 4)));
    return (
      this.unacked >= this.acks.everyEvents ||
      this.unackedBytes >= everyBytes ||
      (this.unackedSince !== null && now >= this.unackedSince + this.acks.maxDelayMs)
    );
  }

  #heartbeatInterval() {
    return Math.min(this.heartbeat.intervalMs, (this.limits.idle_ttl_s * 1000) / 3);
  }

  #heartbeatDue(/** @type {number} */ now) {
    if (now >= this.lastHeartbeat + this.#heartbeatInterval()) return true;
    const barrier = this.heartbeats.length ? this.heartbeats[this.heartbeats.length - 1][1] : this.confirmedSeq;
    const unbarriered = this.sentThrough - barrier;
    if (unbarriered <= 0) return false;
    return unbarriered >= this.heartbeat.confirmEvery || (this.sentThrough >= this.confirmTarget && this.confirmTarget > barrier);
  }
}

const HEARTBEAT_FRAME = JSON.stringify({ type: T.HEARTBEAT });

function isObject(/** @type {unknown} */ value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/** @param {Record<string, any>} event @param {boolean} resuming */
function refusal(event, resuming) {
  const code = typeof event.code === "string" ? event.code : null;
  const message = String(event.message ?? "");
  const reason = typeof event.reason === "string" ? event.reason : null;
  if (resuming && code !== null && RESUME_REFUSALS.has(code)) {
    return new ResumeRefused(code, message, { closeCode: CLOSE_RESUME_REFUSED, reason });
  }
  return new ServerRefused(code, message, { retryable: event.retryable === true, reason });
}

// -- which URL each attempt uses (trio_duplex/client/urls.py) ---------------------------

/** @param {string | string[]} urlOrUrls */
function parseUrls(urlOrUrls) {
  if (typeof urlOrUrls === "string") return [urlOrUrls];
  const urls = Array.from(urlOrUrls);
  if (!urls.length) throw new TypeError("connect needs at least one URL");
  if (!urls.every((url) => typeof url === "string")) throw new TypeError("every URL must be a string");
  const schemes = new Set(urls.map((url) => (url.includes("://") ? url.split("://")[0].toLowerCase() : "")));
  if (![...schemes].every((scheme) => scheme === "ws" || scheme === "wss")) {
    throw new TypeError("every URL must start with ws:// or wss://");
  }
  if (schemes.size > 1) throw new TypeError("the URLs must be all ws:// or all wss://, not a mix");
  return urls;
}

/** The first attempt goes to a random URL; each failed attempt to the next; a lost
 * connection is resumed at its own URL first; draining URLs are skipped while others
 * remain (urls.py has the whole policy). */
class UrlRing {
  /** @param {string[]} urls @param {() => number} random */
  constructor(urls, random) {
    this.urls = urls;
    this.index = urls.length > 1 ? Math.floor(random() * urls.length) % urls.length : 0;
    /** @type {Set<number>} */
    this.draining = new Set();
  }

  get url() {
    return this.urls[this.index];
  }

  markDraining() {
    this.draining.add(this.index);
  }

  attached() {
    this.draining.clear();
  }

  advance() {
    const count = this.urls.length;
    for (let step = 1; step < count; step++) {
      const candidate = (this.index + step) % count;
      if (!this.draining.has(candidate)) {
        this.index = candidate;
        return;
      }
    }
    this.draining.clear();
    this.index = (this.index + 1) % count;
  }
}

// -- the shell --------------------------------------------------------------------------

/** The shell's lifecycle (session.py's _Status): changed only by Session.#to. */
const S = Object.freeze({
  CONNECTING: "connecting",
  ATTACHED: "attached",
  RECONNECTING: "reconnecting", // between connections, after the first attach
  CLOSING: "closing",
  DETACHING: "detaching",
  ENDED: "ended",
  FAILED: "failed",
});

/** @type {Record<string, string[]>} the allowed transitions */
const NEXT = {
  [S.CONNECTING]: [S.ATTACHED, S.ENDED, S.FAILED],
  [S.ATTACHED]: [S.RECONNECTING, S.CLOSING, S.DETACHING, S.ENDED, S.FAILED],
  [S.RECONNECTING]: [S.ATTACHED, S.CLOSING, S.DETACHING, S.ENDED, S.FAILED],
  [S.CLOSING]: [S.DETACHING, S.ENDED, S.FAILED],
  [S.DETACHING]: [S.ENDED, S.FAILED],
  [S.ENDED]: [],
  [S.FAILED]: [],
};
/** @type {Set<string>} */
const OVER = new Set([S.ENDED, S.FAILED]);
/** The supervisor connects no more. */
/** @type {Set<string>} */
const STOPPING = new Set([S.DETACHING, S.ENDED, S.FAILED]);
/** send and confirm reject. */
/** @type {Set<string>} */
const UNUSABLE = new Set([S.CLOSING, S.DETACHING, S.ENDED, S.FAILED]);

const now = () => performance.now();
const CONSTRUCT = Symbol("construct");
const RUN = Symbol("run");

/** One WebSocket: the handshake's first answer, then every message to `onMessage`,
 * until it is lost (`lost` resolves with why). Messages after a loss are ignored. */
class Link {
  /** @param {WebSocket} ws */
  constructor(ws) {
    this.ws = ws;
    ws.binaryType = "arraybuffer";
    /** @type {((data: any) => void) | null} */
    this.onMessage = null;
    /** @type {any[]} messages before onMessage is set */
    this.early = [];
    /** @type {{reason: string, closeCode: number | null, migrating: boolean} | null} */
    this.loss = null;
    /** @type {(() => void) | null} */
    this.wake = null;
    /** @type {(loss: {reason: string, closeCode: number | null, migrating: boolean}) => void} */
    let resolve = () => {};
    /** @type {Promise<{reason: string, closeCode: number | null, migrating: boolean}>} */
    this.lost = new Promise((r) => (resolve = r));
    this.resolveLost = resolve;
    this.opened = false;
    /** the handshake is done: the writer may send */
    this.attached = false;
    this.migrating = false;
    ws.onopen = () => {
      this.opened = true;
      this.wake?.();
    };
    ws.onmessage = (message) => {
      if (this.loss !== null) return;
      if (this.onMessage !== null) this.onMessage(message.data);
      else {
        this.early.push(message.data);
        this.wake?.();
      }
    };
    ws.onclose = (event) => {
      const code = event.code;
      const why = code === 1006 ? "connection lost" : `closed by the server: ${code}${event.reason ? ` ${event.reason}` : ""}`;
      this.end(why, code === 1006 ? null : code, false);
    };
    // Node 20's WebSocket reports a refused connection by an error alone, with no close
    // event: an error ends the connection too (a close event that follows changes nothing).
    ws.onerror = () => this.end(this.opened ? "connection lost" : "the WebSocket handshake failed");
  }

  /** The end of this connection: the first call counts. The socket is closed (a close
   * frame if it can still be sent) and nothing more is read from it. */
  end(/** @type {string} */ reason, /** @type {number | null} */ closeCode = null, close = true) {
    if (this.loss !== null) return;
    this.loss = { reason, closeCode, migrating: this.migrating };
    this.ws.onmessage = this.ws.onopen = null;
    if (close) {
      try {
        this.ws.close(1000);
      } catch {
        // (already closing)
      }
    }
    this.resolveLost(this.loss);
    this.wake?.();
  }

  /** Wait for the socket to open, a first message or the loss, until `deadline`. */
  async until(/** @type {() => boolean} */ ready, /** @type {number} */ deadline) {
    while (!ready() && this.loss === null) {
      const wait = deadline - now();
      if (wait <= 0) throw new AttemptFailed("timed out");
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, wait);
        this.wake = () => {
          clearTimeout(timer);
          resolve(undefined);
        };
      });
      this.wake = null;
    }
  }
}

const DEFAULT_RECONNECT = {
  baseDelayMs: 100,
  maxDelayMs: 5000,
  multiplier: 2,
  jitter: 0.5,
  maxAttempts: 10,
  deadlineMs: 30000,
  retryOpen: true,
};
const DEFAULT_ACKS = { everyEvents: 32, everyBytes: 1 * MiB, maxDelayMs: 500 };
const DEFAULT_HEARTBEAT = { intervalMs: 15000, timeoutMs: 10000, confirmEvery: 64 };

/** One resumable session over any number of connections. Create it with `connect`. */
export class Session extends EventTarget {
  #core;
  #options;
  #urls;
  #random;
  #WebSocket;
  /** @type {string} */
  #status = S.CONNECTING;
  #public = "connecting";
  #attempting = false;
  #detached = false;
  /** @type {ClientError | null} */
  #failure = null;
  /** @type {DuplexEvent | null} */
  #terminal = null;
  /** @type {Link | null} */
  #link = null;
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  #timer = undefined;
  /** @type {DuplexEvent[]} delivered, not yet received */
  #events = [];
  #eventsHead = 0;
  /** @type {{resolve: (event: DuplexEvent) => void, reject: (error: Error) => void}[]} */
  #receivers = [];
  /** @type {{event: DuplexEvent, resolve: (seq: number) => void, reject: (error: Error) => void}[]} */
  #senders = [];
  /** @type {{target: number, resolve: () => void, reject: (error: Error) => void}[]} */
  #confirms = [];
  /** @type {(() => void) | null} */
  #stopWait = null;
  #countReplay = false;
  /** @type {Promise<void>} */
  #done;
  #resolveDone = () => {};

  /** @internal Use `connect`. */
  constructor(/** @type {any} */ secret, /** @type {any} */ urls, /** @type {any} */ core, /** @type {any} */ options) {
    if (secret !== CONSTRUCT) throw new TypeError("use connect() to make a Session");
    super();
    this.#core = core;
    this.#options = options;
    this.#random = options.random;
    this.#urls = new UrlRing(urls, options.random);
    this.#WebSocket = options.WebSocket;
    this.#done = new Promise((resolve) => (this.#resolveDone = resolve));
    this.stats = {
      eventsReceived: 0,
      eventsSent: 0,
      duplicatesDropped: 0,
      resumes: 0,
      replayedEvents: 0,
      resentEvents: 0,
      audioBytesSent: 0,
      audioBytesReceived: 0,
    };
  }

  // -- what the application sees ----------------------------------------------------

  get sessionId() {
    return /** @type {string} */ (this.#core.sessionId);
  }
  get generation() {
    return this.#core.generation;
  }
  /** The wire dialect the session speaks ("native" or "openai"). */
  get dialect() {
    return this.#core.dialect.name;
  }
  get config() {
    return this.#core.config;
  }
  get limits() {
    return this.#core.limits;
  }
  get state() {
    return this.#public;
  }
  get url() {
    return this.#urls.url;
  }
  get error() {
    return this.#failure;
  }

  resumeState() {
    const state = this.#core.resumeState();
    if (state === null) throw new Error("the session has not been attached yet");
    return state;
  }

  /** Queue `event`; resolves with its client_event_seq once there is room.
   * @param {DuplexEvent} event @returns {Promise<number>} */
  send(event) {
    try {
      this.#checkUsable();
      Core.check(event);
      if (this.#senders.length === 0 && this.#hasRoom()) return Promise.resolve(this.#enqueue(event));
    } catch (error) {
      return Promise.reject(error);
    }
    if (this.#senders.length >= this.#options.maxUnconfirmedEvents) {
      return Promise.reject(new RangeError("too many sends waiting for room; await send()"));
    }
    this.#core.requestConfirm(); // a heartbeat barrier frees the buffer soonest
    this.#flush();
    return new Promise((resolve, reject) => this.#senders.push({ event, resolve, reject }));
  }

  /** input_audio_buffer.append of `audio` (bytes in the negotiated input format).
   * @param {ArrayBuffer | ArrayBufferView} audio */
  sendAudio(audio) {
    if (/** @type {any} */ (this.#WebSocket).audioOnTracks === true) {
      return Promise.reject(new TypeError("a call's audio travels on its media tracks (transport webrtc)"));
    }
    let bytes;
    try {
      bytes = toBytes(audio);
    } catch (error) {
      return Promise.reject(error);
    }
    return this.send({ type: T.INPUT_AUDIO_APPEND, audio: bytes });
  }

  /** Resolves once the server has read every event sent so far. @returns {Promise<void>} */
  confirm() {
    try {
      this.#checkUsable();
    } catch (error) {
      return Promise.reject(error);
    }
    const target = this.#core.requestConfirm();
    if (this.#core.confirmedSeq >= target) return Promise.resolve();
    this.#flush();
    return new Promise((resolve, reject) => this.#confirms.push({ target, resolve, reject }));
  }

  /** The next server event. @returns {Promise<DuplexEvent>} */
  receive() {
    if (this.#eventsHead < this.#events.length) {
      const event = this.#events[this.#eventsHead];
      this.#events[this.#eventsHead++] = /** @type {any} */ (undefined);
      if (this.#eventsHead > 1024 && this.#eventsHead * 2 > this.#events.length) {
        this.#events = this.#events.slice(this.#eventsHead);
        this.#eventsHead = 0;
      }
      return Promise.resolve(event);
    }
    if (OVER.has(this.#status)) return Promise.reject(this.#failure ?? new SessionEnded(this.#terminal));
    return new Promise((resolve, reject) => this.#receivers.push({ resolve, reject }));
  }

  async *[Symbol.asyncIterator]() {
    while (true) {
      let event;
      try {
        event = await this.receive();
      } catch (error) {
        if (error instanceof SessionEnded) return;
        throw error;
      }
      yield event;
    }
  }

  /** session.close, then wait until the session has ended (within closeTimeoutMs;
   * then the connection is cut). @param {string} [reason] */
  async close(reason) {
    if (this.#status === S.ATTACHED || this.#status === S.RECONNECTING) {
      this.#core.requestClose(reason ?? null);
      this.#to(S.CLOSING);
      this.#release();
      this.#flush();
    }
    await this.#finishWithin(this.#options.closeTimeoutMs);
  }

  /** Drop the connection, keep the session; resolves with what connect({resume}) needs. */
  async detach() {
    if (this.#status === S.ATTACHED || this.#status === S.RECONNECTING || this.#status === S.CLOSING) {
      this.#to(S.DETACHING);
      const link = this.#link;
      if (link !== null && link.attached && this.#core.owesHello) {
        const frame = this.#core.nextFrame(now()); // the session keeps its whole grace
        if (frame !== null) this.#write(link, frame);
      }
      link?.end("detached");
      this.#stopWait?.();
      this.#release();
    }
    await this.#finishWithin(this.#options.closeTimeoutMs);
    return this.resumeState();
  }

  /** Cut the current socket as a network loss would: the client resumes by itself. */
  dropConnection() {
    this.#link?.end("connection dropped");
  }

  // -- internals ----------------------------------------------------------------------

  async #finishWithin(/** @type {number} */ ms) {
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    let timer;
    const timeout = new Promise((resolve) => (timer = setTimeout(resolve, ms)));
    await Promise.race([this.#done, timeout]);
    clearTimeout(timer);
    if (!OVER.has(this.#status)) {
      // Out of time: cut the connection; the supervisor stops.
      if (this.#status !== S.DETACHING) this.#to(S.DETACHING);
      this.#link?.end("close timed out");
      this.#stopWait?.();
      await this.#done;
    }
  }

  #hasRoom() {
    return this.#core.hasRoom(this.#options.maxUnconfirmedEvents, this.#options.maxUnconfirmedBytes);
  }

  /** @param {DuplexEvent} event */
  #enqueue(event) {
    const seq = this.#core.enqueue(event);
    this.stats.eventsSent += 1;
    const audio = event.audio;
    if (event.type === T.INPUT_AUDIO_APPEND && (ArrayBuffer.isView(audio) || audio instanceof ArrayBuffer)) {
      this.stats.audioBytesSent += audio.byteLength;
    }
    this.#flush();
    return seq;
  }

  #checkUsable() {
    if (this.#failure !== null) throw this.#failure;
    if (UNUSABLE.has(this.#status)) throw new SessionEnded(this.#terminal);
  }

  /** @param {string} status */
  #to(status) {
    if (!NEXT[this.#status].includes(status)) throw new Error(`${this.#status} -> ${status}`);
    this.#status = status;
    this.#publish();
  }

  /** The state the application sees, and a "state" change when it moves. */
  #publish() {
    /** @type {string} */
    let state = this.#status;
    if (state === S.RECONNECTING) state = this.#attempting ? "resuming" : "detached";
    else if (state === S.DETACHING) state = "detached";
    else if (state === S.ENDED) state = this.#detached ? "detached" : "closed";
    if (state !== this.#public) {
      const previous = this.#public;
      this.#public = state;
      this.#change({ kind: "state", previous });
    }
  }

  /** @param {Record<string, any>} change */
  #change(change) {
    const detail = { ...change, state: this.#public };
    if (this.#options.onChange) {
      try {
        this.#options.onChange(detail);
      } catch (error) {
        console.error("trio-duplex: onChange failed", error);
      }
    }
    this.dispatchEvent(new CustomEvent("change", { detail }));
  }

  /** @param {DuplexEvent} event */
  #deliver(event) {
    this.stats.eventsReceived += 1;
    if (event.type === T.OUTPUT_AUDIO_DELTA) {
      const audio = audioBytes(event);
      if (audio !== null) this.stats.audioBytesReceived += audio.length;
    }
    const receiver = this.#receivers.shift();
    if (receiver !== undefined) receiver.resolve(event);
    else this.#events.push(event);
  }

  /** Progress: room for waiting senders, confirmations for waiting confirms. */
  #progress() {
    const core = this.#core;
    while (this.#senders.length && this.#hasRoom() && !UNUSABLE.has(this.#status)) {
      const sender = /** @type {any} */ (this.#senders.shift());
      try {
        sender.resolve(this.#enqueue(sender.event));
      } catch (error) {
        sender.reject(error);
      }
    }
    if (this.#senders.length) core.requestConfirm();
    this.#confirms = this.#confirms.filter((waiter) => {
      if (core.confirmedSeq < waiter.target) return true;
      waiter.resolve();
      return false;
    });
  }

  /** The session cannot be used any more: wake everyone waiting. */
  #release() {
    const error = () => this.#failure ?? new SessionEnded(this.#terminal);
    for (const waiter of [...this.#senders.splice(0), ...this.#confirms.splice(0)]) waiter.reject(error());
    if (OVER.has(this.#status)) {
      for (const receiver of this.#receivers.splice(0)) receiver.reject(error());
    }
  }

  /** @param {DuplexEvent | null} [terminal] */
  #end(terminal = null) {
    if (!OVER.has(this.#status)) {
      this.#terminal = terminal;
      this.#detached = this.#status === S.DETACHING;
      this.#to(S.ENDED);
    }
  }

  /** @param {ClientError} failure */
  #fail(failure) {
    if (!OVER.has(this.#status)) {
      this.#failure = failure;
      this.#to(S.FAILED);
    }
  }

  /** @param {Link} link @param {string | Uint8Array} frame */
  #write(link, frame) {
    try {
      link.ws.send(frame);
    } catch (error) {
      link.end(`send failed: ${error instanceof Error ? error.message : error}`);
    }
  }

  /** The writer: send every frame the state machine has due, then sleep until its
   * next deadline (a heartbeat, an ack, a resend). Synchronous: WebSocket.send only
   * queues. */
  #flush() {
    const link = this.#link;
    if (link === null || !link.attached || link.loss !== null) return;
    const core = this.#core;
    const t = now();
    if (core.heartbeatOverdue(t)) {
      link.end(`no heartbeat_ack within ${core.heartbeat.timeoutMs / 1000}s`);
      return;
    }
    for (let frame = core.nextFrame(t); frame !== null; frame = core.nextFrame(t)) {
      this.#write(link, frame);
      if (link.loss !== null) return;
    }
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => this.#flush(), Math.max(0, core.nextDeadline() - t));
  }

  /** @param {Link} link @param {any} data */
  #onMessage(link, data) {
    const core = this.#core;
    /** @type {DuplexEvent | null} */
    let event;
    let size;
    if (typeof data === "string") {
      event = parseEvent(data);
      size = utf8Len(data);
    } else {
      event = audioEvent(data, core.dialect.outputAudioField); // protocol v2's binary lane
      size = data.byteLength;
    }
    if (event === null) return; // not an event: ignored
    const hadUnacked = core.ackPending;
    let verdict;
    try {
      verdict = core.onEvent(event, size, now());
    } catch (error) {
      this.#fail(/** @type {ClientError} */ (error));
      link.end(String(error));
      return;
    }
    if (verdict === DUPLICATE) {
      this.stats.duplicatesDropped += 1;
      return;
    }
    if (verdict === INTERNAL) {
      if (event.type === T.HEARTBEAT_ACK) this.#countReplay = false;
      this.#progress();
      this.#flush();
      return;
    }
    if (this.#countReplay && Number.isInteger(event.server_event_seq)) this.stats.replayedEvents += 1;
    this.#deliver(event);
    if (event.type === T.GOING_AWAY) {
      const migrating = event.migrating === true;
      if (migrating) {
        this.#urls.markDraining(); // and once it closes, resume elsewhere at once
        link.migrating = true;
      }
      const timeLeft = event.time_left_ms;
      this.#change({ kind: "going_away", timeLeftMs: typeof timeLeft === "number" ? timeLeft : null, migrating });
    }
    if (verdict === END) {
      this.#end(event);
      link.end(`${event.type} (${event.reason})`);
      return;
    }
    if (verdict === REPLACED) {
      const generation = event.attachment_generation;
      this.#fail(new SessionReplaced(Number.isInteger(generation) ? generation : null));
      link.end("replaced");
      return;
    }
    if (!hadUnacked && core.ackPending) this.#flush(); // time the ack from this event
  }

  /** The supervisor: connect, and reconnect after each loss, until the session ends or
   * detaches. Resolves `attached` once (true), or rejects it with the failure. */
  async [RUN](/** @type {(error: ClientError | null) => void} */ attached) {
    try {
      await this.#supervise(attached);
    } catch (error) {
      const failure =
        error instanceof ClientError ? error : new ClientError(`internal error: ${error instanceof Error ? error.stack : error}`);
      const neverAttached = this.#status === S.CONNECTING;
      this.#fail(failure);
      if (neverAttached) attached(failure);
    } finally {
      clearTimeout(this.#timer);
      this.#end();
      this.#release();
      this.#resolveDone();
      attached(this.#failure ?? new SessionEnded(this.#terminal)); // (no-op once attached)
    }
  }

  /** @param {(error: ClientError | null) => void} attached */
  async #supervise(attached) {
    const policy = this.#options.reconnect;
    const urls = this.#urls;
    let failures = 0;
    let retries = 0; // in this outage (or before the first attach): numbered from 1
    let outageStart = now();
    let lastError = "";
    let first = true;
    let atOnce = false; // the next attempt skips its backoff (a migration)
    while (!STOPPING.has(this.#status)) {
      if (!first) {
        const elapsed = now() - outageStart;
        const connecting = this.#status === S.CONNECTING;
        if (
          failures >= policy.maxAttempts ||
          elapsed >= policy.deadlineMs ||
          (connecting && !policy.retryOpen && failures >= urls.urls.length)
        ) {
          throw new ReconnectFailed(failures, elapsed, lastError);
        }
        retries += 1;
        let delay = 0; // a migration; or, failing fast, the open's one round
        if (!atOnce && !(connecting && !policy.retryOpen)) {
          const base = Math.min(policy.maxDelayMs, policy.baseDelayMs * policy.multiplier ** (retries - 1));
          delay = Math.min(base * (1 - policy.jitter * this.#random()), policy.deadlineMs - elapsed);
        }
        atOnce = false;
        this.#change({ kind: "retrying", attempt: retries, delayMs: delay, error: lastError });
        await new Promise((resolve) => {
          const timer = setTimeout(resolve, delay);
          this.#stopWait = () => {
            clearTimeout(timer);
            resolve(undefined);
          };
        });
        this.#stopWait = null;
        if (STOPPING.has(this.#status)) return;
      }
      first = false;
      let loss;
      try {
        loss = await this.#connection(attached);
      } catch (error) {
        if (error instanceof AttemptFailed) {
          failures += 1;
          lastError = error.message;
          if (error.draining) urls.markDraining();
          urls.advance();
          continue;
        }
        if (error instanceof ResumeRefused && this.#status === S.CLOSING && error.code === "session_resume_expired") {
          return; // our close won the race: the session is gone, as asked
        }
        throw error;
      }
      if (STOPPING.has(this.#status)) return;
      failures = retries = 0;
      outageStart = now();
      lastError = loss.reason;
      if (loss.migrating) {
        // The server is moving the session: resume it now, elsewhere if we can.
        atOnce = true;
        urls.advance();
      }
      this.#change({ kind: "disconnected", reason: loss.reason, closeCode: loss.closeCode });
    }
  }

  /** One connection: open it, handshake, then run until it is lost.
   * @param {(error: ClientError | null) => void} attached */
  async #connection(attached) {
    const core = this.#core;
    const deadline = now() + this.#options.openTimeoutMs;
    // The credential (servers with --api-key-file): the resume token to resume, else the
    // token given, if any; a subprotocol, since a browser cannot set headers.
    const credential = core.resumeToken ?? this.#options.token;
    const protocols = core.dialect.protocols(credential);
    /** @type {WebSocket} */
    let ws;
    try {
      ws = new this.#WebSocket(core.openingUrl(this.#urls.url), protocols);
    } catch (error) {
      // A malformed URL: no retry helps. (The message may quote the subprotocols, so
      // the credential is taken out of it.)
      let why = error instanceof Error ? error.message : String(error);
      if (credential != null) why = why.split(credential).join("<credential>");
      throw new ServerRefused(null, `cannot open a WebSocket: ${why}`);
    }
    const link = new Link(ws);
    this.#link = link; // (so that detach and dropConnection reach it during the handshake)
    this.#attempting = true;
    this.#publish();
    let handshaken = false;
    try {
      try {
        await link.until(() => link.opened, deadline);
        if (link.loss === null) {
          const opening = core.openingFrame();
          if (opening !== null) this.#write(link, opening);
          await link.until(() => link.early.length > 0, deadline);
        }
      } catch (error) {
        link.end(error instanceof Error ? error.message : String(error));
        throw error;
      }
      if (link.early.length === 0) {
        const loss = /** @type {{reason: string, closeCode: number | null}} */ (link.loss);
        if (loss.closeCode === CLOSE_RESUME_REFUSED && core.sessionId !== null) {
          throw new ResumeRefused(null, "resume refused", { closeCode: CLOSE_RESUME_REFUSED });
        }
        if (!link.opened) {
          throw new AttemptFailed(
            "the WebSocket handshake failed (no server there, or it refused the upgrade: a wrong path or credential)",
          );
        }
        throw new AttemptFailed(loss.reason, loss.closeCode === CLOSE_GOING_AWAY);
      }
      const first = link.early.shift();
      const reply = typeof first === "string" ? parseEvent(first) : null;
      if (reply === null) {
        link.end("protocol violation");
        throw new ProtocolViolation("the server's first frame is not a JSON event");
      }
      let change;
      try {
        change = core.onHandshake(reply, now());
      } catch (error) {
        link.end("refused");
        if (error instanceof ServerRefused && error.retryable && !(error instanceof ResumeRefused)) {
          throw new AttemptFailed(error.message, error.code === "server_shutting_down");
        }
        throw error;
      }
      handshaken = true;
      this.#urls.attached();
      const firstAttach = this.#status === S.CONNECTING;
      link.attached = true;
      this.#attempting = false;
      if (firstAttach || this.#status === S.RECONNECTING) this.#to(S.ATTACHED);
      else this.#publish();
      if (change.resumed) {
        this.stats.resumes += 1;
        this.stats.resentEvents += change.resent;
        // Events seq'd before the server read this heartbeat come before its ack: the
        // replay (and what was live meanwhile) is what arrives until then.
        this.#countReplay = true;
        core.requestHeartbeat();
      }
      this.#change({ kind: "attached", ...change });
      if (firstAttach) attached(null);
      link.onMessage = (data) => this.#onMessage(link, data);
      for (const data of link.early.splice(0)) {
        if (link.loss !== null) break;
        this.#onMessage(link, data);
      }
      if (STOPPING.has(this.#status)) link.end("detached"); // (detached meanwhile)
      this.#progress();
      this.#flush();
      return await link.lost;
    } finally {
      clearTimeout(this.#timer);
      this.#countReplay = false;
      if (link.loss === null) link.end(handshaken ? "connection ended" : "attempt ended");
      if (this.#link === link) this.#link = null;
      this.#attempting = false;
      if (this.#status === S.ATTACHED) this.#to(S.RECONNECTING);
      else this.#publish();
    }
  }
}


// -- WebRTC calls (OpenAI's /v1/realtime/calls flow, docs/webrtc.md) --------------------

const CREDENTIAL_PROTOCOL = "openai-insecure-api-key.";

/** A WebSocket-shaped constructor whose every "connection" is a WebRTC call: a peer
 * connection with the `oai-events` data channel and `mediaStream`'s audio, its offer
 * POSTed to the session's URL (an http(s) `/v1/realtime/calls` URL; a resume's query
 * added by the OpenAI dialect, as for an upgrade) with the credential as `Authorization:
 * Bearer`. The data channel carries the session's events; the audio travels on the
 * tracks (`onTrack` gets the server's), so `sendAudio` is refused. A lost peer connection
 * is a lost connection: the session resumes on a new call, as on a new WebSocket.
 * @param {{mediaStream?: MediaStream | null, onTrack?: ((track: MediaStreamTrack, stream: MediaStream | undefined) => void) | null,
 *   rtcConfiguration?: RTCConfiguration, RTCPeerConnection?: typeof RTCPeerConnection, fetch?: typeof fetch}} [options]
 * @returns {new (url: string, protocols?: string | string[]) => WebSocket} */
export function webrtc(options = {}) {
  const PeerConnection = options.RTCPeerConnection ?? globalThis.RTCPeerConnection;
  const fetchImpl = options.fetch ?? globalThis.fetch;
  if (typeof PeerConnection !== "function" || typeof fetchImpl !== "function") {
    throw new TypeError("webrtc needs RTCPeerConnection and fetch (a browser, or pass them in the options)");
  }
  const mediaStream = options.mediaStream ?? null;
  const onTrack = options.onTrack ?? null;
  const configuration = options.rtcConfiguration ?? {};

  class CallSocket {
    /** Audio goes on the tracks: Session.sendAudio refuses. */
    static audioOnTracks = true;

    /** @param {string} url @param {string | string[]} [protocols] */
    constructor(url, protocols = []) {
      this.url = url;
      this.binaryType = "arraybuffer";
      this.readyState = 0;
      this.protocol = "";
      this.extensions = "";
      this.bufferedAmount = 0;
      /** @type {((event: any) => void) | null} */ this.onopen = null;
      /** @type {((event: any) => void) | null} */ this.onmessage = null;
      /** @type {((event: any) => void) | null} */ this.onclose = null;
      /** @type {((event: any) => void) | null} */ this.onerror = null;
      /** The call's `Location` once answered: `/v1/realtime/calls/rtc_...` (its hangup URL). */
      /** @type {string | null} */ this.location = null;
      const offered = typeof protocols === "string" ? [protocols] : protocols;
      const carrier = offered.find((p) => p.startsWith(CREDENTIAL_PROTOCOL));
      const credential = carrier === undefined ? null : carrier.slice(CREDENTIAL_PROTOCOL.length);
      this.pc = new PeerConnection(configuration);
      this.dc = this.pc.createDataChannel("oai-events");
      this.#start(credential).catch((/** @type {unknown} */ error) => this.#lost(error));
    }

    /** @param {string | null} credential */
    async #start(credential) {
      const { pc, dc } = this;
      dc.onopen = () => {
        if (this.readyState !== 0) return;
        this.readyState = 1;
        this.onopen?.({ type: "open" });
      };
      dc.onmessage = (event) => {
        if (this.readyState === 1) this.onmessage?.({ data: event.data });
      };
      dc.onclose = () => this.#lost(null);
      pc.onconnectionstatechange = () => {
        if (pc.connectionState === "failed" || pc.connectionState === "closed") this.#lost(null);
      };
      pc.ontrack = (event) => onTrack?.(event.track, event.streams[0]);
      const tracks = mediaStream === null ? [] : mediaStream.getAudioTracks();
      if (tracks.length === 0) pc.addTransceiver("audio", { direction: "recvonly" });
      for (const track of tracks) pc.addTrack(track, /** @type {MediaStream} */ (mediaStream));
      await pc.setLocalDescription(await pc.createOffer());
      const offer = /** @type {RTCSessionDescription} */ (pc.localDescription);
      /** @type {Record<string, string>} */
      const headers = { "Content-Type": "application/sdp" };
      if (credential !== null) headers.Authorization = `Bearer ${credential}`;
      const response = await fetchImpl(this.url, { method: "POST", body: offer.sdp, headers });
      if (this.readyState > 1) return;
      if (response.status !== 201) {
        let why = `HTTP ${response.status}`;
        try {
          const body = await response.json();
          if (isObject(body) && isObject(body.error) && typeof body.error.message === "string") {
            why += `: ${body.error.message}`;
          }
        } catch {
          // (not OpenAI's error JSON)
        }
        throw new Error(`the call was refused: ${why}`);
      }
      this.location = response.headers.get("Location");
      await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
    }

    /** @param {unknown} error */
    #lost(error) {
      if (this.readyState > 1) return;
      const opened = this.readyState === 1;
      this.readyState = 3;
      if (error !== null) this.onerror?.({ type: "error", error });
      try {
        this.pc.close();
      } catch {
        // (closed already)
      }
      this.onclose?.({ code: 1006, reason: opened ? "peer connection lost" : "", wasClean: false });
    }

    /** @param {string | ArrayBufferLike | ArrayBufferView | Blob} data */
    send(data) {
      if (typeof data !== "string") throw new TypeError("a call's audio travels on its media track");
      this.dc.send(data);
    }

    /** Close the peer connection (the session detaches, as for a closed WebSocket; its
     * close() ends it first). @param {number} [code] @param {string} [reason] */
    close(code, reason) {
      this.#lost(null);
    }
  }
  return /** @type {any} */ (CallSocket);
}

/** Open a session (`options.session`), or resume one (`options.resume`); resolves once
 * it is attached. @param {string | string[]} url @param {Record<string, any>} [options] */
export async function connect(url, options = {}) {
  const urls = parseUrls(url);
  if (options.transport != null && options.transport !== "websocket" && options.transport !== "webrtc") {
    throw new TypeError('transport must be "websocket" or "webrtc"');
  }
  if (options.transport === "webrtc") {
    if ((options.dialect ?? "native") !== "openai") {
      throw new TypeError('transport "webrtc" speaks the OpenAI dialect: pass dialect: "openai"');
    }
    options = {
      ...options,
      WebSocket: webrtc({
        mediaStream: options.mediaStream,
        onTrack: options.onTrack,
        rtcConfiguration: options.rtcConfiguration,
        RTCPeerConnection: options.RTCPeerConnection,
        fetch: options.fetch,
      }),
    };
  }
  const WebSocketClass = options.WebSocket ?? globalThis.WebSocket;
  if (typeof WebSocketClass !== "function") {
    throw new TypeError(
      "no WebSocket: pass options.WebSocket, or run Node with --experimental-websocket (Node 20)",
    );
  }
  const opts = {
    reconnect: { ...DEFAULT_RECONNECT, ...options.reconnect },
    acks: { ...DEFAULT_ACKS, ...options.acks },
    heartbeat: { ...DEFAULT_HEARTBEAT, ...options.heartbeat },
    openTimeoutMs: options.openTimeoutMs ?? 10000,
    closeTimeoutMs: options.closeTimeoutMs ?? 5000,
    maxUnconfirmedEvents: options.maxUnconfirmedEvents ?? 1024,
    maxUnconfirmedBytes: options.maxUnconfirmedBytes ?? 16 * MiB,
    token: options.token ?? null,
    dialect: options.dialect ?? "native",
    WebSocket: WebSocketClass,
    onChange: options.onChange ?? null,
    random: options.random ?? Math.random,
  };
  if (typeof opts.dialect !== "string" || !Object.hasOwn(DIALECTS, opts.dialect)) {
    throw new TypeError(`dialect must be one of ${Object.keys(DIALECTS).join(", ")}`);
  }
  // A subprotocol is an HTTP token: a credential with other characters cannot be sent.
  if (opts.token !== null && (typeof opts.token !== "string" || !/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(opts.token))) {
    throw new TypeError("token must be a non-empty string of HTTP token characters (letters, digits, -._~ ...)");
  }
  const policy = opts.reconnect;
  if (!(policy.maxAttempts >= 1) || !(policy.baseDelayMs > 0) || !(policy.maxDelayMs > 0)) {
    throw new RangeError("reconnect: maxAttempts >= 1, baseDelayMs > 0 and maxDelayMs > 0");
  }
  if (!(policy.multiplier >= 1) || !(policy.jitter >= 0 && policy.jitter <= 1) || !(policy.deadlineMs > 0)) {
    throw new RangeError("reconnect: multiplier >= 1, 0 <= jitter <= 1 and deadlineMs > 0");
  }
  let core;
  if (options.resume != null) {
    if (options.session != null || options.audio != null) {
      throw new TypeError("give either session/audio (open) or resume, not both");
    }
    const { sessionId, resumeToken, lastServerEventSeq } = options.resume;
    if (typeof sessionId !== "string" || typeof resumeToken !== "string" || !Number.isInteger(lastServerEventSeq)) {
      throw new TypeError("resume needs {sessionId, resumeToken, lastServerEventSeq}");
    }
    core = new Core({}, opts.acks, opts.heartbeat, { sessionId, resumeToken, lastServerEventSeq }, opts.dialect);
  } else {
    const config = { ...options.session };
    if (options.audio != null) config.audio = options.audio;
    core = new Core(config, opts.acks, opts.heartbeat, null, opts.dialect);
  }
  const session = new Session(CONSTRUCT, urls, core, opts);
  /** @type {ClientError | null} */
  const refused = await new Promise((resolve) => {
    session[RUN](resolve);
  });
  if (refused !== null) throw refused;
  return session;
}
export { Core as SessionCore };
