// The typed public API of trio-duplex.js: the JavaScript client of trio-duplex's
// wire protocol (docs/protocol.md), with the guarantees of the Python client
// (trio_duplex.client, docs/client.md). The API is documented in docs/browser.md.

/** A server or client event: a JSON object with a string `type` (docs/protocol.md). */
export interface DuplexEvent {
  type: string;
  server_event_seq?: number;
  client_event_seq?: number;
  [field: string]: unknown;
}

/** `response.output_audio.delta` as it arrives on the binary lane (kind-2 message):
 * its seq and the payload, in the session's negotiated output format. */
export interface BinaryAudioEvent extends DuplexEvent {
  type: "response.output_audio.delta";
  server_event_seq: number;
  audio: Uint8Array;
}

export interface AudioFormat {
  format?: "pcm16" | "g711_ulaw" | "g711_alaw" | "opus";
  rate?: 8000 | 16000 | 24000 | 48000;
}

/** `session.audio` (protocol v2): the lane and the formats each way. */
export interface AudioConfig {
  wire?: "json" | "binary";
  input?: AudioFormat;
  output?: AudioFormat;
}

/** `session.created.limits`, as the server sent them (defaults until it has). */
export interface Limits {
  disconnect_grace_s: number;
  idle_ttl_s: number;
  journal_max_bytes: number;
  max_event_bytes: number;
  max_config_bytes?: number;
  /** Protocol v2: the input bounds `send` paces by (absent: a v1 server). */
  max_pending_input?: number;
  max_pending_input_bytes?: number;
  [field: string]: unknown;
}

/** What a later page or process needs to resume the session: plain JSON, so it can be
 * kept in sessionStorage. `resumeToken` is a secret. */
export interface ResumeState {
  sessionId: string;
  resumeToken: string;
  lastServerEventSeq: number;
}

/** Jittered exponential backoff, per outage (reset once attached again). Retry `n`
 * waits `min(maxDelayMs, baseDelayMs * multiplier**(n-1))`, less a random share of up
 * to `jitter`. Gives up after `maxAttempts` failed attempts or `deadlineMs` since the
 * loss (or since `connect` began). */
export interface ReconnectOptions {
  /** default 100 */
  baseDelayMs?: number;
  /** default 5000 */
  maxDelayMs?: number;
  /** default 2 */
  multiplier?: number;
  /** 0..1, default 0.5 */
  jitter?: number;
  /** default 10 */
  maxAttempts?: number;
  /** default 30000 (the server's default disconnect grace) */
  deadlineMs?: number;
  /** Retry the first connection too (default true). False: a failed first attempt
   * (each URL once) rejects `connect` with ReconnectFailed at once. */
  retryOpen?: boolean;
}

/** `session.event_ack` after `everyEvents` events or `everyBytes` bytes (capped at a
 * quarter of the journal), or `maxDelayMs` after the oldest unacked one. */
export interface AckOptions {
  /** default 32 */
  everyEvents?: number;
  /** default 1 MiB */
  everyBytes?: number;
  /** default 500 */
  maxDelayMs?: number;
}

/** `session.heartbeat` every `intervalMs` (at most a third of the idle TTL); no ack
 * within `timeoutMs` means the connection is dead (it is dropped and resumed). An early
 * heartbeat after `confirmEvery` unconfirmed events frees the resend buffer. */
export interface HeartbeatOptions {
  /** default 15000 */
  intervalMs?: number;
  /** default 10000 */
  timeoutMs?: number;
  /** default 64 */
  confirmEvery?: number;
}

export interface WebRtcOptions {
  mediaStream?: MediaStream | null;
  onTrack?: ((track: MediaStreamTrack, stream: MediaStream | undefined) => void) | null;
  rtcConfiguration?: RTCConfiguration;
  RTCPeerConnection?: typeof RTCPeerConnection;
  fetch?: typeof fetch;
}

/** A WebSocket-shaped constructor whose every connection is a WebRTC call (what
 * `connect`'s `transport: "webrtc"` uses; docs/webrtc.md). */
export function webrtc(options?: WebRtcOptions): WebSocketConstructor;

/** A WebSocket constructor (the browser's, Node ≥ 22's or Node 20's with
 * `--experimental-websocket`, or one with the same interface). */
export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocket;

export type SessionState =
  | "connecting" // before the first attach: connect() has not resolved yet
  | "attached" // a connection carries the session
  | "detached" // no connection: lost (the client resumes after its backoff), or detach() was called (final)
  | "resuming" // an attempt to resume is under way
  | "closing" // close() was called: session.close goes out, waiting for session.closed
  | "closed" // over: the terminal event arrived (or the session ended without a failure)
  | "failed"; // over: `session.error` says why

/** What `onChange` and the session's "change" events report. Every change carries the
 * session's `state` after it. */
export type Change =
  | { kind: "state"; state: SessionState; previous: SessionState }
  | {
      kind: "attached";
      state: SessionState;
      sessionId: string;
      generation: number;
      /** false: the session was just opened */
      resumed: boolean;
      /** client events queued for (re)sending on this connection */
      resent: number;
    }
  | { kind: "disconnected"; state: SessionState; reason: string; closeCode: number | null }
  | { kind: "retrying"; state: SessionState; attempt: number; delayMs: number; error: string }
  | { kind: "going_away"; state: SessionState; timeLeftMs: number | null; migrating: boolean };

/** The wire a URL speaks: `native` (`/v1/duplex`, docs/protocol.md) or `openai`
 * (`/v1/realtime`: OpenAI Realtime GA events with the resume extension, docs/openai.md). */
export type Dialect = "native" | "openai";

export interface ConnectOptions {
  /** The wire the URLs speak (default "native"). With "openai" the server speaks first,
   * `session` is an OpenAI session object sent as the session's first event, and a
   * resume is the upgrade `?resume=ID&last_received_server_event_seq=N`. */
  dialect?: Dialect;
  /** The configuration of a new session (its first `session.update`). */
  session?: Record<string, unknown>;
  /** `session.audio` (protocol v2), merged into `session`. */
  audio?: AudioConfig;
  /** A credential for a server with `--api-key-file`: an API key, or better a client
   * token (`POST /v1/client_tokens`), offered as the subprotocol
   * `trio-duplex.bearer.TOKEN` (dialect "openai": `openai-insecure-api-key.TOKEN`;
   * browsers cannot set headers). A resume presents the session's resume token instead. */
  token?: string;
  /** Resume this session instead of opening one (not with `session` or `audio`). */
  resume?: ResumeState;
  reconnect?: ReconnectOptions;
  acks?: AckOptions;
  heartbeat?: HeartbeatOptions;
  /** One attempt: the WebSocket handshake and the server's first answer (default 10000). */
  openTimeoutMs?: number;
  /** close(): time allowed for session.closed before the socket is cut (default 5000). */
  closeTimeoutMs?: number;
  /** `send` waits while the resend buffer holds this many events (default 1024)... */
  maxUnconfirmedEvents?: number;
  /** ...or this many bytes (default 16 MiB). */
  maxUnconfirmedBytes?: number;
  /** The WebSocket constructor (default: the global one). */
  WebSocket?: WebSocketConstructor;
  /** "webrtc": each connection is a WebRTC call (docs/webrtc.md): the URL is the
   * server's `http(s)://…/v1/realtime/calls`, `dialect` must be "openai", `token` goes
   * as `Authorization: Bearer` (a client secret, `ek_…`), the events travel on the
   * `oai-events` data channel and the audio on the tracks (`mediaStream` in, `onTrack`
   * out; `sendAudio` is refused). A lost peer connection is resumed on a new call.
   * Default "websocket". */
  transport?: "websocket" | "webrtc";
  /** transport "webrtc": the microphone (its audio tracks are sent); none: receive only. */
  mediaStream?: MediaStream | null;
  /** transport "webrtc": called with the server's audio track of each call. */
  onTrack?: ((track: MediaStreamTrack, stream: MediaStream | undefined) => void) | null;
  /** transport "webrtc": the peer connections' configuration (default: none). */
  rtcConfiguration?: RTCConfiguration;
  /** transport "webrtc": the RTCPeerConnection constructor (default: the global one). */
  RTCPeerConnection?: typeof RTCPeerConnection;
  /** transport "webrtc": the fetch that POSTs each offer (default: the global one). */
  fetch?: typeof fetch;
  /** Called synchronously on every change of the connection or the state. */
  onChange?: (change: Change) => void;
  /** The randomness of the backoff jitter and of the first of several URLs (default Math.random). */
  random?: () => number;
}

/** Counters, live (the same object, updated in place). */
export interface SessionStats {
  /** server events delivered to the application (seq'd and control events) */
  eventsReceived: number;
  /** client events queued by send/sendAudio */
  eventsSent: number;
  /** server events dropped because their seq had already been received */
  duplicatesDropped: number;
  /** committed resumes by this client */
  resumes: number;
  /** seq'd events a resume brought that the client had not received: those the server
   * had sequenced when it read the client's first heartbeat on the resumed connection */
  replayedEvents: number;
  /** client events sent again on a new connection (not yet confirmed at the loss) */
  resentEvents: number;
  /** payload bytes of input audio queued by sendAudio */
  audioBytesSent: number;
  /** payload bytes of output audio delivered */
  audioBytesReceived: number;
}

/** One resumable session over any number of WebSocket connections. Create it with
 * `connect`. Dispatches "change" events (a CustomEvent whose `detail` is a Change). */
export declare class Session extends EventTarget {
  private constructor();
  readonly dialect: Dialect;
  readonly sessionId: string;
  readonly generation: number;
  /** The session's configuration (the server's copy from session.created/resumed). */
  readonly config: Record<string, unknown>;
  readonly limits: Limits;
  readonly state: SessionState;
  readonly stats: SessionStats;
  /** The URL of the current connection (between connections: of the next attempt). */
  readonly url: string;
  /** The failure, once `state` is "failed". */
  readonly error: ClientError | null;
  /** Queue `event` and resolve with its `client_event_seq`, once there is room (the
   * resend buffer and the server's input bounds). Rejects with TypeError for a
   * missing type, a client-managed type (session.resume, heartbeat, event_ack,
   * close) or a given client_event_seq; EventTooLarge above `max_event_bytes`;
   * the session's failure, or SessionEnded once closing or over. */
  send(event: DuplexEvent): Promise<number>;
  /** `input_audio_buffer.append` of `audio` (bytes in the negotiated input format):
   * a binary message on the binary lane, base64 JSON otherwise. As `send`. */
  sendAudio(audio: ArrayBuffer | ArrayBufferView): Promise<number>;
  /** Resolves once the server has read every event sent so far. */
  confirm(): Promise<void>;
  /** The next server event. Rejects with the failure once the session has failed, or
   * SessionEnded once the terminal event has been received. */
  receive(): Promise<DuplexEvent>;
  /** Yields every event; ends after the terminal event; throws the failure. */
  [Symbol.asyncIterator](): AsyncIterator<DuplexEvent>;
  /** session.close, then wait for session.closed (within closeTimeoutMs). */
  close(reason?: string): Promise<void>;
  /** Drop the connection, keep the session: resolves with what
   * `connect(url, {resume})` needs. Events already received stay readable. */
  detach(): Promise<ResumeState>;
  /** Cut the current socket as a network loss would, without detaching: the client
   * resumes by itself. */
  dropConnection(): void;
  /** The current session id, resume token and last received seq. */
  resumeState(): ResumeState;
}

/** Open a session (`options.session`), or resume one (`options.resume`), over one URL
 * or several (the nodes of a cluster: all ws:// or all wss://). Resolves once the
 * session is attached; rejects with ServerRefused, ResumeRefused, ReconnectFailed or
 * ProtocolViolation. */
export declare function connect(url: string | string[], options?: ConnectOptions): Promise<Session>;

/** The audio of an `input_audio_buffer.append` or `response.output_audio.delta` as
 * bytes, whichever lane it came on; null if none or not valid base64. */
export declare function audioBytes(event: DuplexEvent): Uint8Array | null;

// -- errors (mirroring trio_duplex/client/errors.py) -----------------------------------

/** Base of every error the client raises about the session or the server. */
export declare class ClientError extends Error {}

/** The server answered the open or resume with `error{code}` (or a refusing close). */
export declare class ServerRefused extends ClientError {
  constructor(
    code: string | null,
    message: string,
    options?: { closeCode?: number | null; retryable?: boolean; reason?: string | null },
  );
  readonly code: string | null;
  readonly closeCode: number | null;
  readonly retryable: boolean;
  /** e.g. "node_lost" on a session_resume_expired */
  readonly reason: string | null;
}

/** A terminal resume refusal: session_resume_expired, invalid_resume_token,
 * invalid_session_resume, or close 4001. The session cannot be resumed again. */
export declare class ResumeRefused extends ServerRefused {}

/** Another connection resumed this session (session.replaced, close 4000). */
export declare class SessionReplaced extends ClientError {
  constructor(generation: number | null);
  readonly generation: number | null;
}

/** No connection could be (re)established within the attempts or the deadline. A
 * refused credential (HTTP 401) is one too: a WebSocket cannot see the status. */
export declare class ReconnectFailed extends ClientError {
  constructor(attempts: number, elapsedMs: number, lastError: string);
  readonly attempts: number;
  readonly elapsedMs: number;
  readonly lastError: string;
}

/** The session is over (closed, expired, closing or detached); `event` is the terminal
 * event (session.closed / session.expired) when one arrived. */
export declare class SessionEnded extends ClientError {
  constructor(event?: DuplexEvent | null);
  readonly event: DuplexEvent | null;
}

/** The server broke docs/protocol.md. */
export declare class ProtocolViolation extends ClientError {}

/** An event would exceed the server's max_event_bytes; it was not queued. */
export declare class EventTooLarge extends ClientError {
  constructor(size: number, limit: number);
  readonly size: number;
  readonly limit: number;
}

// -- the state machine, for tests and diagnostics ---------------------------------------

/** The client side of the protocol with no I/O and no clock (as trio_duplex.client's
 * SessionState): time comes in as `now` (ms), server events go into `onEvent`, frames
 * come out of `nextFrame`. Applications use `connect`; its members may change. */
export declare class SessionCore {
  constructor(
    config: Record<string, unknown>,
    acks: Required<AckOptions>,
    heartbeat: Required<HeartbeatOptions>,
    resume: ResumeState | null,
    dialect?: Dialect,
  );
  readonly sessionId: string | null;
  readonly resumeToken: string | null;
  readonly generation: number;
  readonly limits: Limits;
  readonly lastReceivedSeq: number;
  readonly confirmedSeq: number;
  readonly rewinds: number;
  readonly outbox: ReadonlyArray<{ seq: number; frame: string | Uint8Array; size: number }>;
  /** The URL a connection dials (a resume in the openai dialect: its query). */
  openingUrl(url: string): string;
  /** null: the dialect's server speaks first. */
  openingFrame(): string | null;
  onHandshake(
    event: DuplexEvent,
    now: number,
  ): { sessionId: string; generation: number; resumed: boolean; resent: number };
  enqueue(event: DuplexEvent): number;
  requestConfirm(): number;
  nextFrame(now: number): string | Uint8Array | null;
  nextDeadline(): number;
  heartbeatOverdue(now: number): boolean;
  hasRoom(maxEvents: number, maxBytes: number): boolean;
  onEvent(event: DuplexEvent, size: number, now: number): "deliver" | "duplicate" | "internal" | "end" | "replaced";
}
