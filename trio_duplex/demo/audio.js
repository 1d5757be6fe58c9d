// The page's audio: one AudioContext, the microphone's worklet (capture → PCM16 chunks at
// the session's input rate) and the playback worklet (the jitter buffer).

export const CHUNK_MS = 20; // the microphone's chunk: one binary message per 20 ms
export const JITTER_TARGET_MS = 80; // buffered before playback starts (and after an underrun)
export const JITTER_MAX_MS = 2000; // the jitter buffer's bound; beyond, the oldest is dropped

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
  }

  /** Queue PCM16 samples (an ArrayBuffer, given away) for playback. */
  play(pcm) {
    if (this.playback) this.playback.port.postMessage({ type: "audio", pcm }, [pcm]);
  }

  /** Stop playback at once: empty the jitter buffer. */
  flush() {
    if (this.playback) this.playback.port.postMessage({ type: "flush" });
  }

  /** The response is over: play what is left, even below the target. */
  drain() {
    if (this.playback) this.playback.port.postMessage({ type: "drain" });
  }

  /** Capture the microphone; `onChunk({pcm, level})` gets every 20 ms chunk. */
  async startMic(onChunk) {
    await this.start();
    if (this.mic) return;
    const stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
    });
    const source = this.context.createMediaStreamSource(stream);
    const node = new AudioWorkletNode(this.context, "trio-duplex-mic", {
      numberOfOutputs: 0,
      processorOptions: { targetRate: this.inputRate, chunkMs: CHUNK_MS },
    });
    node.port.onmessage = (message) => onChunk(message.data);
    source.connect(node);
    this.mic = { stream, source, node };
  }

  stopMic() {
    const mic = this.mic;
    if (!mic) return;
    this.mic = null;
    mic.source.disconnect();
    mic.node.port.onmessage = null;
    for (const track of mic.stream.getTracks()) track.stop();
  }
}
