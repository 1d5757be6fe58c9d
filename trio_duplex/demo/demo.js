// The demo page: one session on the server's engine (`voice`, or `speech`: a
// conversation), with the microphone on the binary lane, the engine's audio through the
// jitter buffer, what was heard and the reply's text, barge-in (the page's own, and the
// server's), a resume on demand, and the event timeline. Served by `trio-duplex serve
// --demo` (docs/browser.md). With `--calls` too, `?transport=webrtc` holds the same
// session as a WebRTC call (docs/webrtc.md): OpenAI's dialect on the data channel, the
// microphone and the reply as media tracks, with the browser's own echo cancellation,
// jitter buffer and playback; a dropped connection is a closed peer connection, resumed
// by a new call.

import { audioBytes, connect } from "/demo/trio-duplex.js";
import { AudioIO, CHUNK_MS } from "/demo/audio.js";

const RATE = 24000; // pcm16 both ways at the voice engine's own rate: no resampling delay
const BYTES_PER_MS = (RATE * 2) / 1000;
const TIMELINE_ROWS = 200; // the timeline keeps the last rows only
const SEQS_KEPT = 100000; // seqs kept for the check below (and for tests), at most
const MIC_WAITING_MAX = 50; // 1 s of microphone chunks waiting for room, at most
const LOUD_CHUNKS = 2; // the level must pass the threshold this many chunks in a row (40 ms)
const HEARD_KEPT = 100; // final transcripts kept for tests, at most

const $ = (id) => document.getElementById(id);
const CALLS_PATH = document.querySelector('meta[name="trio-duplex-calls"]').content;
const WEBRTC = CALLS_PATH !== "" && new URLSearchParams(location.search).get("transport") === "webrtc";
let micStream = null; // WebRTC mode: the microphone's stream, its track sent on each call

// What the page saw, for the counters and for tests (window.demo).
const seen = {
  seqs: [], // every server_event_seq delivered, in order (the last SEQS_KEPT)
  lastSeq: 0,
  gaps: 0, // a seq that was not lastSeq + 1
  duplicates: 0, // a seq at or below lastSeq
  bargeIns: 0, // the page's own: the button, or the microphone's level
  serverBargeIns: 0, // the server's: it heard speech start (or cancelled) while a reply played
  heard: [], // every input_audio.transcript.done's text, in order (the last HEARD_KEPT)
  firming: [], // what "You said" showed at each transcript.delta (the last HEARD_KEPT)
  droppedFrames: 0, // audio frames that arrived after a barge-in, not played
  played: 0, // source samples the playback worklet consumed
  buffered: 0,
  underruns: 0,
  flushes: 0,
  playedAtFlush: 0, // what had been played when the last flush emptied the buffer
  reports: 0,
  micChunks: 0,
  micDropped: 0, // chunks dropped: the client had no room for a second of them
  lastLevel: 0,
  maxLevel: 0,
  closed: null, // the terminal event (session.closed / session.expired), with its usage
  states: [], // the session's states, in order (the last 1000)
  cspViolations: [], // what the Content-Security-Policy refused (none, if the page is right)
  responses: { created: 0, done: 0, cancelled: 0 },
};
window.demo = seen;

let session = null;
let speaking = null; // the response being received: its id, from created to done/cancelled
let cancelling = false; // a barge-in was sent: drop audio until response.cancelled
let loud = 0;
let micWaiting = 0; // sendAudio calls not resolved yet
let showAudio = false;

const audio = new AudioIO({
  inputRate: RATE,
  outputRate: RATE,
  onReport(report) {
    seen.played = report.played;
    seen.buffered = report.buffered;
    seen.underruns = report.underruns;
    seen.flushes = report.flushes;
    seen.playedAtFlush = report.playedAtFlush;
    seen.reports = report.reports;
    render();
  },
});

function setText(id, value) {
  const element = $(id);
  const text = String(value);
  if (element.textContent !== text) element.textContent = text;
}

function render() {
  const stats = session ? session.stats : null;
  if (session) {
    setText("state", session.state);
    $("state").dataset.state = session.state;
  }
  if (stats) {
    setText("events-received", stats.eventsReceived);
    setText("events-sent", stats.eventsSent);
    setText("resumes", stats.resumes);
    setText("replayed", stats.replayedEvents);
    setText("duplicates", stats.duplicatesDropped);
    setText("audio-in-ms", Math.round(stats.audioBytesSent / BYTES_PER_MS));
    setText("audio-out-ms", Math.round(stats.audioBytesReceived / BYTES_PER_MS));
  }
  setText("last-seq", seen.lastSeq);
  setText("seq-gaps", seen.gaps + seen.duplicates);
  setText("audio-played-ms", Math.round(seen.played / (RATE / 1000)));
  setText("buffered-ms", Math.round(seen.buffered / (RATE / 1000)));
  setText("underruns", seen.underruns);
  setText("barge-ins", seen.bargeIns);
  setText("server-barge-ins", seen.serverBargeIns);
  setText("dropped-frames", seen.droppedFrames);
  $("mic-level").value = seen.lastLevel;
}

// in: a server event; out: a client event; local: what the client or the page did.
const ARROWS = { in: "← in", out: "→ out", local: "• page" };

function row(seq, direction, type, detail, isAudio) {
  if (isAudio && !showAudio) return;
  const body = $("timeline");
  const tr = document.createElement("tr");
  tr.className = direction;
  // Server seqs as they are; client seqs (their own numbering) with a "c".
  const number = seq == null ? "" : direction === "out" ? `c${seq}` : String(seq);
  for (const text of [number, ARROWS[direction], type, detail ?? ""]) {
    const td = document.createElement("td");
    td.textContent = String(text);
    tr.append(td);
  }
  body.prepend(tr);
  while (body.rows.length > TIMELINE_ROWS) body.lastElementChild.remove();
}

function note(seq) {
  if (seq <= seen.lastSeq) seen.duplicates += 1;
  else if (seq !== seen.lastSeq + 1) seen.gaps += 1;
  seen.lastSeq = Math.max(seen.lastSeq, seq);
  seen.seqs.push(seq);
  if (seen.seqs.length > SEQS_KEPT) seen.seqs.splice(0, seen.seqs.length - SEQS_KEPT);
}

// The OpenAI dialect's events (WebRTC mode) as the native ones the page shows.
const OPENAI_NAMES = {
  "response.output_audio_transcript.delta": "response.output_text.delta",
  "response.output_text.delta": "response.output_text.delta",
  "conversation.item.input_audio_transcription.delta": "input_audio.transcript.delta",
  "conversation.item.input_audio_transcription.completed": "input_audio.transcript.done",
};

function fromOpenAI(event) {
  const type = OPENAI_NAMES[event.type];
  if (type === "response.output_text.delta") return { ...event, type, text: event.delta };
  if (type === "input_audio.transcript.delta") return { ...event, type, text: event.delta };
  if (type === "input_audio.transcript.done") return { ...event, type, text: event.transcript };
  if (event.type === "response.created") return { ...event, response_id: event.response.id };
  if (event.type === "response.done") {
    const status = event.response.status;
    return { ...event, type: status === "cancelled" ? "response.cancelled" : "response.done", response_id: event.response.id };
  }
  if (event.type === "error") return { ...event, code: event.error.code, message: event.error.message };
  return event;
}

function handle(received) {
  const event = WEBRTC ? fromOpenAI(received) : received;
  const seq = event.server_event_seq;
  if (typeof seq === "number") note(seq);
  const type = event.type;
  if (type === "response.output_audio.delta") {
    const bytes = audioBytes(event);
    if (cancelling || !bytes) {
      seen.droppedFrames += 1;
    } else {
      // A copy: the worklet takes the buffer over (and the bytes may be a view).
      audio.play(bytes.slice().buffer);
    }
    row(seq, "in", type, `${bytes ? bytes.length : 0} bytes`, true);
    return;
  }
  let detail = "";
  if (type === "response.created") {
    speaking = event.response_id;
    cancelling = false;
    seen.responses.created += 1;
    detail = event.response_id;
    $("transcript").textContent = ""; // the reply to this turn only
  } else if (type === "response.output_text.delta") {
    $("transcript").textContent += event.text;
    detail = JSON.stringify(event.text);
  } else if (type === "input_audio_buffer.speech_started") {
    // The engine detects turns itself, and cancels a reply the user speaks over: stop
    // playing it now, not when its response.cancelled comes.
    if (speaking !== null && !cancelling) serverBargeIn("speech_started");
    heardText("", false);
    detail = `at ${event.audio_start_ms} ms`;
  } else if (type === "input_audio.transcript.delta") {
    // The deltas join into the transcript so far (each later one has its leading space).
    heardText($("heard").textContent + event.text, false);
    seen.firming.push($("heard").textContent);
    if (seen.firming.length > HEARD_KEPT) seen.firming.shift();
    detail = JSON.stringify(event.text);
  } else if (type === "input_audio.transcript.done") {
    heardText(event.text, true);
    seen.heard.push(event.text);
    if (seen.heard.length > HEARD_KEPT) seen.heard.shift();
    detail = JSON.stringify(event.text);
  } else if (type === "response.done" || type === "response.cancelled") {
    if (type === "response.done") {
      seen.responses.done += 1;
      if (!WEBRTC) audio.drain();
    } else {
      seen.responses.cancelled += 1;
      // Cancelled by the server (a typed turn over it, say): what is buffered goes too.
      if (event.response_id === speaking && !cancelling) serverBargeIn(type);
      cancelling = false;
    }
    if (event.response_id === speaking) speaking = null;
    detail = event.response_id;
  } else if (type === "error") {
    detail = `${event.code}: ${event.message}`;
  } else if (type === "session.closed" || type === "session.expired") {
    seen.closed = event;
    detail = event.reason ?? "";
  }
  row(seq, "in", type, detail, false);
}

async function send(event) {
  const seq = await session.send(event);
  row(seq, "out", event.type, event.text ? JSON.stringify(event.text) : "", false);
  return seq;
}

function bargeIn(why) {
  audio.flush(); // stop at once, before the server even hears of it
  seen.bargeIns += 1;
  if (speaking !== null && !cancelling) {
    cancelling = true;
    send({ type: "response.cancel" }).catch(failed);
    // A call's audio is queued at the server's end: it drops it (output_audio_buffer.cleared).
    if (WEBRTC) send({ type: "output_audio_buffer.clear" }).catch(failed);
  }
  row(null, "local", "barge-in", why, false);
  render();
}

// The server stopped the reply: empty the jitter buffer, and drop the reply's frames still
// on their way (until its response.cancelled). The page sends no response.cancel.
function serverBargeIn(why) {
  audio.flush();
  seen.serverBargeIns += 1;
  cancelling = true;
  row(null, "local", "barge-in", `server: ${why}`, false);
}

function heardText(text, final) {
  setText("heard", text);
  $("heard").dataset.final = String(final);
}

function onMicChunk({ pcm, level }) {
  seen.micChunks += 1;
  seen.lastLevel = level;
  seen.maxLevel = Math.max(seen.maxLevel, level);
  const threshold = Number($("threshold").value);
  loud = level >= threshold ? loud + 1 : 0;
  if (loud === LOUD_CHUNKS && speaking !== null && !cancelling) bargeIn("voice");
  if (!session || ["closing", "closed", "failed"].includes(session.state)) return;
  // sendAudio resolves once the client has room (its resend buffer holds ~20 s of this
  // audio while detached); past that, live audio is dropped rather than piled up.
  if (micWaiting >= MIC_WAITING_MAX) {
    seen.micDropped += 1;
    return;
  }
  micWaiting += 1;
  session
    .sendAudio(pcm)
    .then((seq) => row(seq, "out", "input_audio_buffer.append", `${CHUNK_MS} ms`, true))
    .catch(failed)
    .finally(() => {
      micWaiting -= 1;
    });
}

function failed(error) {
  row(null, "local", "client error", String(error && error.message ? error.message : error), false);
  render();
}

function onChange(change) {
  const detail =
    change.kind === "state"
      ? `${change.previous} → ${change.state}`
      : change.kind === "attached"
        ? `generation ${change.generation}${change.resumed ? ", resumed" : ""}`
        : change.kind === "disconnected"
          ? `${change.reason} (${change.closeCode ?? "no code"})`
          : change.kind === "retrying"
            ? `attempt ${change.attempt} in ${Math.round(change.delayMs)} ms`
            : "";
  if (change.kind === "attached") setText("session-id", change.sessionId);
  if (seen.states[seen.states.length - 1] !== change.state) {
    seen.states.push(change.state);
    if (seen.states.length > 1000) seen.states.shift();
  }
  setText("state", change.state);
  $("state").dataset.state = change.state;
  row(null, "local", `[${change.kind}]`, detail, false);
  render();
}

async function openCall() {
  setText("transport", "WebRTC");
  $("switch-transport").textContent = "use WebSocket";
  $("switch-transport").href = "?";
  $("switch-transport").hidden = false;
  try {
    // The browser's own echo cancellation and noise suppression, on the call's track.
    micStream = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    for (const track of micStream.getAudioTracks()) track.enabled = false; // until "Microphone"
  } catch (error) {
    failed(error); // no microphone: the call only receives
  }
  return connect(`${location.protocol}//${location.host}${CALLS_PATH}`, {
    transport: "webrtc",
    dialect: "openai",
    mediaStream: micStream,
    onTrack(track) {
      $("remote-audio").srcObject = new MediaStream([track]);
    },
    onChange,
  });
}

async function main() {
  const path = document.querySelector('meta[name="trio-duplex-path"]').content;
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const pcm16 = { format: "pcm16", rate: RATE };
  if (CALLS_PATH !== "" && !WEBRTC) {
    $("switch-transport").href = "?transport=webrtc";
    $("switch-transport").hidden = false;
  }
  session = WEBRTC
    ? await openCall()
    : await connect(`${scheme}//${location.host}${path}`, {
        audio: { wire: "binary", input: pcm16, output: pcm16 },
        onChange,
      });
  setText("session-id", session.sessionId);
  render();
  for await (const event of session) {
    handle(event);
    render();
  }
  render();
}

document.addEventListener("securitypolicyviolation", (e) => {
  if (seen.cspViolations.length < 100) seen.cspViolations.push(`${e.violatedDirective} ${e.blockedURI}`);
});
$("text-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("text").value.trim();
  if (!text || !session) return;
  $("transcript").textContent = "";
  if (WEBRTC) {
    $("remote-audio").play().catch(() => {}); // a user gesture: the browser lets it play
    const content = [{ type: "input_text", text }];
    send({ type: "conversation.item.create", item: { type: "message", role: "user", content } }).catch(failed);
    send({ type: "response.create" }).catch(failed);
    return;
  }
  audio.start().catch(failed); // a user gesture: the browser lets audio start now
  send({ type: "input.text.append", text }).catch(failed);
});
$("mic").addEventListener("click", () => {
  const button = $("mic");
  if (WEBRTC) {
    // The call's track is live from the start; the button mutes and unmutes it.
    const tracks = micStream ? micStream.getAudioTracks() : [];
    const on = tracks.length > 0 && !tracks[0].enabled;
    for (const track of tracks) track.enabled = on;
    button.setAttribute("aria-pressed", String(on));
    return;
  }
  if (audio.mic) {
    audio.stopMic();
    button.setAttribute("aria-pressed", "false"); // a toggle: its name stays, its state shows
    return;
  }
  audio
    .startMic(onMicChunk)
    .then(() => {
      button.setAttribute("aria-pressed", "true");
    })
    .catch(failed);
});
$("barge-in").addEventListener("click", () => bargeIn("button"));
$("drop").addEventListener("click", () => {
  if (session) session.dropConnection();
});
$("close").addEventListener("click", () => {
  if (session) session.close().catch(failed);
});
$("threshold").addEventListener("input", () => {
  setText("threshold-value", $("threshold").value);
});
$("show-audio").addEventListener("change", () => {
  showAudio = $("show-audio").checked;
});

$("timeline-limit").textContent = String(TIMELINE_ROWS);
main().catch(failed);
