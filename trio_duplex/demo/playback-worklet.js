// The playback AudioWorklet: a jitter buffer of PCM16 chunks at the session's output
// rate, played at the AudioContext's rate (linear interpolation).
//
// It waits until `targetMs` of audio is buffered before it starts (and again after an
// underrun), so that chunks arriving unevenly play smoothly; "drain" (the response is
// over) plays what is left even below the target; "flush" (barge-in) empties it at
// once. The buffer is a ring of `maxMs`: beyond it the oldest audio is dropped (counted).
// Every ~50 ms, and at once after a flush, it reports what it played to the page.

class PlaybackProcessor extends AudioWorkletProcessor {
  constructor(options) {
    const { sourceRate, targetMs, maxMs } = options.processorOptions;
    super();
    this.step = sourceRate / sampleRate; // source samples per output sample
    this.ring = new Float32Array(Math.round((sourceRate * maxMs) / 1000));
    this.target = Math.round((sourceRate * targetMs) / 1000);
    this.read = 0; // index of the next source sample (integer part of the position)
    this.fraction = 0;
    this.size = 0; // source samples buffered
    this.playing = false;
    this.draining = false;
    this.played = 0; // source samples played, in all
    this.underruns = 0;
    this.overflows = 0;
    this.flushes = 0;
    this.playedAtFlush = 0;
    this.reports = 0;
    this.sinceReport = 0;
    this.reportEvery = Math.round((sampleRate * 0.05) / 128);
    this.port.onmessage = (message) => this.onMessage(message.data);
  }

  onMessage(data) {
    if (data.type === "audio") {
      this.write(new Int16Array(data.pcm));
    } else if (data.type === "flush") {
      this.size = 0;
      this.fraction = 0;
      this.playing = false;
      this.draining = false;
      this.flushes += 1;
      this.playedAtFlush = this.played; // nothing more may play until new audio comes
      this.report();
    } else if (data.type === "drain") {
      this.draining = true;
    }
  }

  write(samples) {
    const ring = this.ring;
    this.draining = false; // audio of a new response: wait for the target again
    for (let i = 0; i < samples.length; i++) {
      if (this.size === ring.length) {
        this.read = (this.read + 1) % ring.length; // full: drop the oldest sample
        this.size -= 1;
        this.overflows += 1;
      }
      ring[(this.read + this.size) % ring.length] = samples[i] / 0x8000;
      this.size += 1;
    }
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    const ring = this.ring;
    if (!this.playing && this.size > 0 && (this.size >= this.target || this.draining)) {
      this.playing = true;
    }
    let i = 0;
    if (this.playing) {
      for (; i < out.length; i++) {
        if (this.size < 2) {
          // Out of audio: an underrun, unless the response was over (drained).
          if (!this.draining) this.underruns += 1;
          this.played += this.size;
          this.size = 0;
          this.fraction = 0;
          this.playing = false;
          break;
        }
        const a = ring[this.read];
        const b = ring[(this.read + 1) % ring.length];
        out[i] = a + (b - a) * this.fraction;
        this.fraction += this.step;
        const whole = Math.min(Math.floor(this.fraction), this.size);
        if (whole) {
          this.fraction -= whole;
          this.read = (this.read + whole) % ring.length;
          this.size -= whole;
          this.played += whole;
        }
      }
    }
    out.fill(0, i);
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    if (++this.sinceReport >= this.reportEvery) this.report();
    return true;
  }

  report() {
    this.sinceReport = 0;
    this.reports += 1;
    this.port.postMessage({
      played: this.played,
      buffered: this.size,
      playing: this.playing,
      underruns: this.underruns,
      overflows: this.overflows,
      flushes: this.flushes,
      playedAtFlush: this.playedAtFlush,
      reports: this.reports,
    });
  }
}

registerProcessor("trio-duplex-playback", PlaybackProcessor);
