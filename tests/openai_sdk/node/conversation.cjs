'use strict';
// The official Node SDK (npm `openai`, unchanged; package.json pins it) holds conversations
// with `trio-duplex serve` over wss://.../v1/realtime: OpenAIRealtimeWebSocket (the
// WebSocket global, given here by the `ws` package, which Node 20 lacks; it offers the
// subprotocols `realtime` and `openai-insecure-api-key.KEY` and aborts unless one is
// selected), and OpenAIRealtimeWS (`ws` with an Authorization header).
//
// node conversation.cjs BASE_URL VOICE_BASE_URL API_KEY [SCENARIO ...]: BASE_URL is
// https://H:P/v1 (the SDK always dials wss://); the server's CA comes from
// NODE_EXTRA_CA_CERTS. Prints one JSON object, scenario -> what the SDK's events were
// (or {crash}), which tests/openai_sdk/test_node_sdk.py asserts on.

const crypto = require('node:crypto');
const WS = require('ws');
const { OpenAI } = require('openai');
const { OpenAIRealtimeWebSocket } = require('openai/realtime/websocket');
const { OpenAIRealtimeWS } = require('openai/realtime/ws');
const { OpenAIRealtimeError } = require('openai/realtime/internal-base');

globalThis.WebSocket = WS.WebSocket;

const TIMEOUT_MS = 20000;
const RATE = 24000;
const TEXT = 'hello from the node sdk';
const LONG_TEXT = Array.from({ length: 40 }, (_, n) => `word${n}`).join(' ');
const MODEL = 'gpt-realtime-test';

function pcm16(ms, hz = 440) {
  const count = (RATE * ms) / 1000;
  const out = Buffer.alloc(count * 2);
  for (let n = 0; n < count; n++) {
    out.writeInt16LE(Math.trunc(8000 * Math.sin((2 * Math.PI * hz * n) / RATE)), n * 2);
  }
  return out;
}

const sha = (buffer) => crypto.createHash('sha256').update(buffer).digest('hex');

// Every event the SDK emits ('event'), and every error it raises ('error': an
// OpenAIRealtimeError for an `error` event, or a socket's failure), in order.
class Reader {
  constructor(rt) {
    this.rt = rt;
    this.queue = [];
    this.waiter = null;
    this.types = [];
    this.eventIds = [];
    this.seen = [];
    this.errors = [];
    this.socketErrors = [];
    rt.on('event', (event) => this.push(event));
    rt.on('error', (error) => {
      if (error instanceof OpenAIRealtimeError && error.error) {
        this.errors.push({
          realtimeError: true,
          error: error.error,
          event_id: error.event_id ?? null,
          message: error.message,
        });
      } else {
        this.socketErrors.push(String(error && error.message));
        this.push({ type: '(socket error)', message: String(error && error.message) });
      }
    });
    // A close wakes a reader waiting for more (with what the server said before it).
    rt.socket.addEventListener('close', (event) => {
      const said = this.queue.concat(this.seen).filter((e) => e.type === 'error').map((e) => e.error);
      this.push({ type: '(socket closed)', message: `closed ${event.code} after ${JSON.stringify(said)}` });
    });
  }

  push(event) {
    this.queue.push(event);
    if (this.waiter) {
      const wake = this.waiter;
      this.waiter = null;
      wake();
    }
  }

  async next() {
    if (this.queue.length === 0) {
      await new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no event within ${TIMEOUT_MS} ms`)), TIMEOUT_MS);
        this.waiter = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
    const event = this.queue.shift();
    if (event.type === '(socket error)') throw new Error(`socket error: ${event.message}`);
    if (event.type === '(socket closed)') throw new Error(event.message);
    this.seen.push(event);
    this.types.push(event.type);
    this.eventIds.push(event.event_id ?? null);
    return event;
  }

  async until(type) {
    const events = [];
    for (;;) {
      const event = await this.next();
      events.push(event);
      if (event.type === type) return events;
    }
  }

  record() {
    return { types: this.types, event_ids: this.eventIds, errors: this.errors, socket_errors: this.socketErrors };
  }
}

function turnSummary(events) {
  const created = events.filter((e) => e.type === 'response.created');
  const done = events.filter((e) => e.type === 'response.done');
  const pick = (type) => events.filter((e) => e.type === type);
  const audio = Buffer.concat(pick('response.output_audio.delta').map((e) => Buffer.from(e.delta, 'base64')));
  const summary = {
    types: events.map((e) => e.type),
    text: pick('response.output_text.delta').map((e) => e.delta).join(''),
    transcript: pick('response.output_audio_transcript.delta').map((e) => e.delta).join(''),
    audio_bytes: audio.length,
    audio_sha: sha(audio),
    response_ids: [...new Set(events.filter((e) => 'response_id' in e).map((e) => e.response_id))].sort(),
    created_id: created.length ? created[0].response.id : null,
  };
  for (const e of events) {
    if (e.type === 'response.output_text.done') summary.text_done = e.text;
    if (e.type === 'response.output_audio_transcript.done') summary.transcript_done = e.transcript;
  }
  if (done.length) {
    const response = done[done.length - 1].response;
    summary.done_id = response.id;
    summary.status = response.status;
    summary.output = response.output;
  }
  return summary;
}

async function open(Klass, apiKey, baseURL) {
  const client = new OpenAI({ apiKey, baseURL, maxRetries: 0 });
  const rt = new Klass({ model: MODEL }, client);
  const reader = new Reader(rt);
  return { rt, reader, url: rt.url.toString() };
}

function close(rt) {
  return new Promise((resolve) => {
    if (rt.socket.readyState === WS.WebSocket.CLOSED) return resolve();
    rt.socket.addEventListener('close', () => resolve());
    rt.close();
  });
}

async function textOnly(rt, reader) {
  rt.send({ type: 'session.update', session: { type: 'realtime', output_modalities: ['text'] } });
  return (await reader.until('session.updated')).pop();
}

async function textTurn(rt, reader, text) {
  rt.send({
    type: 'conversation.item.create',
    item: { type: 'message', role: 'user', content: [{ type: 'input_text', text }] },
  });
  rt.send({ type: 'response.create' });
  return reader.until('response.done');
}

const scenarios = {
  async session(args) {
    const { rt, reader, url } = await open(OpenAIRealtimeWebSocket, args.apiKey, args.baseURL);
    try {
      const [created] = await reader.until('session.created');
      return {
        ...reader.record(),
        url: url.replace(/:\d+\//, ':PORT/'),
        protocol: rt.socket.protocol,
        session: created.session,
        extension_keys: Object.keys(created).filter((k) => !['type', 'event_id', 'session'].includes(k)).sort(),
      };
    } finally {
      await close(rt);
    }
  },

  async text(args) {
    const { rt, reader } = await open(OpenAIRealtimeWebSocket, args.apiKey, args.baseURL);
    try {
      await reader.until('session.created');
      const updated = await textOnly(rt, reader);
      const events = await textTurn(rt, reader, TEXT);
      return { ...reader.record(), updated_modalities: updated.session.output_modalities, turn: turnSummary(events) };
    } finally {
      await close(rt);
    }
  },

  async ws_class(args) {
    // OpenAIRealtimeWS: the key in an Authorization header, no subprotocol offered.
    const { rt, reader } = await open(OpenAIRealtimeWS, args.apiKey, args.baseURL);
    try {
      await reader.until('session.created');
      await textOnly(rt, reader);
      const events = await textTurn(rt, reader, TEXT);
      return { ...reader.record(), protocol: rt.socket.protocol, turn: turnSummary(events) };
    } finally {
      await close(rt);
    }
  },

  async audio_echo(args) {
    const { rt, reader } = await open(OpenAIRealtimeWebSocket, args.apiKey, args.baseURL);
    const sent = pcm16(300);
    try {
      await reader.until('session.created');
      const pcm = { type: 'audio/pcm', rate: RATE };
      rt.send({
        type: 'session.update',
        session: { type: 'realtime', output_modalities: ['audio'], audio: { input: { format: pcm }, output: { format: pcm } } },
      });
      const updated = (await reader.until('session.updated')).pop();
      for (let start = 0; start < sent.length; start += 4800) {
        rt.send({ type: 'input_audio_buffer.append', audio: sent.subarray(start, start + 4800).toString('base64') });
      }
      rt.send({ type: 'input_audio_buffer.commit' });
      const committed = (await reader.until('input_audio_buffer.committed')).pop();
      rt.send({ type: 'response.create' });
      const events = await reader.until('response.done');
      return {
        ...reader.record(),
        formats: [updated.session.audio.input.format, updated.session.audio.output.format],
        committed_item_id: committed.item_id,
        sent_bytes: sent.length,
        sent_sha: sha(sent),
        turn: turnSummary(events),
      };
    } finally {
      await close(rt);
    }
  },

  async cancel(args) {
    const { rt, reader } = await open(OpenAIRealtimeWebSocket, args.apiKey, args.voiceURL);
    try {
      await reader.until('session.created');
      rt.send({
        type: 'conversation.item.create',
        item: { type: 'message', role: 'user', content: [{ type: 'input_text', text: LONG_TEXT }] },
      });
      rt.send({ type: 'response.create' });
      const before = await reader.until('response.output_audio.delta');
      rt.send({ type: 'response.cancel' });
      const rest = await reader.until('response.done');
      rt.send({ type: 'session.update', session: { type: 'realtime', instructions: 'after' } });
      const after = await reader.until('session.updated');
      return { ...reader.record(), turn: turnSummary([...before, ...rest]), after: after.map((e) => e.type) };
    } finally {
      await close(rt);
    }
  },

  async error(args) {
    const { rt, reader } = await open(OpenAIRealtimeWebSocket, args.apiKey, args.baseURL);
    try {
      await reader.until('session.created');
      const events = [];
      for (const bad of [
        { type: 'no.such.event', event_id: 'evt_unknown_1' },
        { type: 'input_audio_buffer.append', audio: '@@ not base64 @@', event_id: 'e2' },
      ]) {
        rt.send(bad);
        events.push(await reader.next());
      }
      await textOnly(rt, reader);
      const turn = await textTurn(rt, reader, 'still here');
      return { ...reader.record(), error_events: events, turn: turnSummary(turn) };
    } finally {
      await close(rt);
    }
  },

  async wrong_key(args) {
    // A key the server does not know: the upgrade is refused, the socket fails.
    const { rt, reader } = await open(OpenAIRealtimeWebSocket, 'sk-not-a-key', args.baseURL);
    try {
      await reader.next();
      return { ...reader.record(), accepted: true };
    } catch (error) {
      return { ...reader.record(), refused: String(error.message) };
    } finally {
      await close(rt);
    }
  },

  async client_secret(args) {
    const client = new OpenAI({ apiKey: args.apiKey, baseURL: args.baseURL, maxRetries: 0 });
    const secret = await client.realtime.clientSecrets.create({
      expires_after: { anchor: 'created_at', seconds: 600 },
      session: { type: 'realtime', instructions: 'be brief', output_modalities: ['text'] },
    });
    const issued = {
      secret_session: secret.session,
      expires_in: secret.expires_at - Math.floor(Date.now() / 1000),
      value_is_ephemeral: typeof secret.value === 'string' && secret.value !== args.apiKey,
    };
    const { rt, reader } = await open(OpenAIRealtimeWebSocket, secret.value, args.baseURL);
    try {
      const [created] = await reader.until('session.created');
      const events = await textTurn(rt, reader, 'secret turn');
      return { ...reader.record(), ...issued, created_session: created.session, turn: turnSummary(events) };
    } catch (error) {
      // (its own failure, so that the secret's issue is judged on its own)
      return { ...reader.record(), ...issued, connect_crash: String((error && error.stack) || error) };
    } finally {
      await close(rt);
    }
  },
};

async function main() {
  const [baseURL, voiceURL, apiKey, ...names] = process.argv.slice(2);
  const args = { baseURL, voiceURL, apiKey };
  const results = {};
  for (const name of names.length ? names : Object.keys(scenarios)) {
    if (!(name in scenarios)) throw new Error(`no scenario ${name}`);
    try {
      results[name] = await scenarios[name](args);
    } catch (error) {
      results[name] = { crash: String((error && error.stack) || error) };
    }
  }
  process.stdout.write(JSON.stringify(results));
}

main().then(
  () => process.exit(0),
  (error) => {
    process.stderr.write(String((error && error.stack) || error) + '\n');
    process.exit(1);
  },
);
