// The page's audio: one AudioContext, the microphone's worklet (capture → PCM16 chunks at
// the session's input rate) and the playback worklet (the jitter buffer).

export const CHUNK_MS = 20; // the microphone's chunk: one binary message per 20 ms
export const JITTER_TARGET_MS = 80; // buffered before playback starts (and after an underrun)
export const JITTER_MAX_MS = 2000; // the jitter buffer's bound; beyond, the oldest is dropped
const PENDING_MAX = JITTER_MAX_MS / CHUNK_MS; // messages kept while the worklet loads

export class AudioIO {
  /** @param {{inputRate: number, outputRate: number, onReport: (r: object) => void}} options */
  constructor({ inputRate, outputRate, onReport }) {
    this.inputRate = inputRate;
    this.outputRate = outputRate;
    this.onReport = onReport;
    this.context = null;
    this.playback = null;
    this.mic = null; // {stream, source, node}
    this.starting = null;
    this.pending = []; // messages for the playback worklet before it exists (bounded)
  }

  /** Create the context and load the worklets, once; resume a suspended context (a
   * browser starts it suspended until a user gesture). */
  async start() {
    if (!this.starting) this.starting = this._start();
    await this.starting;
    if (this.context.state === "suspended") await this.context.resume();
  }

  async _start() {
    const context = new AudioContext({ latencyHint: "interactive" });
    await context.audioWorklet.addModule("/demo/mic-worklet.js");
    await context.audioWorklet.addModule("/demo/playback-worklet.js");
    const playback = new AudioWorkletNode(context, "trio-duplex-playback", {
      numberOfInputs: 0,
      outputChannelCount: [1],
      processorOptions: {
        sourceRate: this.outputRate,
        targetMs: JITTER_TARGET_MS,
        maxMs: JITTER_MAX_MS,
      },
    });
    playback.port.onmessage = (message) => this.onReport(message.data);
    playback.connect(context.destination);
    this.context = context;
    this.playback = playback;
    for (const [message, transfer] of this.pending.splice(0)) {
      playback.port.postMessage(message, transfer);
    }
  }

  /** Queue PCM16 samples (an ArrayBuffer, given away) for playback. */
  play(pcm) {
    this._post({ type: "audio", pcm }, [pcm]);
  }

  /** Stop playback at once: empty the jitter buffer. */
  flush() {
    this.pending.length = 0;
    this._post({ type: "flush" });
  }

  /** The response is over: play what is left, even below the target. */
  drain() {
    this._post({ type: "drain" });
  }

  _post(message, transfer = []) {
    if (this.playback) {
      this.playback.port.postMessage(message, transfer);
    } else if (message.type !== "flush" && this.pending.length < PENDING_MAX) {
      this.pending.push([message, transfer]); // until the worklet is loaded
    }
  }

  /** Capture the microphone; `onChunk({pcm, level})` gets every 20 ms chunk. */
  async startMic(onChunk) {
    await this.start();
    if (this.mic) return;
    const stream = await navigator.mediaDevices.getUserMedia({
      // Echo cancellation keeps the engine's own voice from the speakers out of the mic
      // (it would barge in on itself); no noise suppression or gain control, so that
      // the level the barge-in threshold is compared with is the microphone's own.
      audio: {
        channelCount: 1,
        echoCancellation: true,
        noiseSuppression: false,
        autoGainControl: false,
      },
    });
    const source = this.context.createMediaStreamSource(stream);
    const node = new AudioWorkletNode(this.context, "trio-duplex-mic", {
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { targetRate: this.inputRate, chunkMs: CHUNK_MS },
    });
    node.port.onmessage = (message) => onChunk(message.data);
    // Connected to the output through a muted gain: a browser renders only what the
    // destination pulls (a node without outputs is not pulled everywhere).
    const mute = new GainNode(this.context, { gain: 0 });
    source.connect(node).connect(mute).connect(this.context.destination);
    this.mic = { stream, source, node, mute };
  }

  stopMic() {
    const mic = this.mic;
    if (!mic) return;
    this.mic = null;
    mic.source.disconnect();
    mic.mute.disconnect();
    mic.node.port.onmessage = null;
    for (const track of mic.stream.getTracks()) track.stop();
  }
}
