// The microphone's AudioWorklet: resamples the capture (the AudioContext's rate) to the
// session's input rate, and posts 20 ms chunks of PCM16 with their level (RMS, 0..1).
// Downsampling averages the input samples that fall into each output sample (a box
// filter: enough against aliasing for speech at 24 kHz); upsampling holds the last one.

class MicProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { targetRate, chunkMs } = options.processorOptions;
    this.step = sampleRate / targetRate; // input samples per output sample
    this.size = Math.round((targetRate * chunkMs) / 1000);
    this.chunk = new Int16Array(this.size);
    this.filled = 0;
    this.sum = 0;
    this.count = 0;
    this.position = 0; // input samples since the last output sample
    this.energy = 0;
    this.last = 0;
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true; // no input connected (yet)
    for (let i = 0; i < channel.length; i++) {
      this.sum += channel[i];
      this.count += 1;
      this.position += 1;
      while (this.position >= this.step) {
        this.position -= this.step;
        const value = this.count ? this.sum / this.count : this.last;
        this.last = value;
        this.sum = 0;
        this.count = 0;
        this.push(value);
      }
    }
    return true;
  }

  push(value) {
    const clamped = Math.max(-1, Math.min(1, value));
    this.energy += clamped * clamped;
    this.chunk[this.filled++] = clamped < 0 ? clamped * 0x8000 : clamped * 0x7fff;
    if (this.filled === this.size) {
      const level = Math.sqrt(this.energy / this.size);
      const pcm = this.chunk.buffer;
      this.port.postMessage({ pcm, level }, [pcm]); // given away: the chunk is detached
      this.chunk = new Int16Array(this.size);
      this.filled = 0;
      this.energy = 0;
    }
  }
}

registerProcessor("trio-duplex-mic", MicProcessor);
