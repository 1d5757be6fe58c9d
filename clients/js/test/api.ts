// Checked by tsc, never run: the public API as docs/browser.md uses it, against
// trio-duplex.d.ts (an import of the module resolves to its .d.ts).
import {
  type Change,
  ClientError,
  type DuplexEvent,
  ReconnectFailed,
  ResumeRefused,
  type ResumeState,
  type Session,
  audioBytes,
  connect,
} from "../src/trio-duplex.js";

export async function example(url: string, stored: string | null): Promise<void> {
  const resume: ResumeState | undefined = stored === null ? undefined : JSON.parse(stored);
  let session: Session;
  try {
    session = await connect([url], {
      ...(resume ? { resume } : { session: { voice: "alto" }, audio: { wire: "binary", input: { format: "pcm16", rate: 16000 } } }),
      token: "client-token",
      reconnect: { maxAttempts: 5, baseDelayMs: 100, maxDelayMs: 2000 },
      heartbeat: { intervalMs: 5000, timeoutMs: 4000 },
      onChange: (change: Change) => {
        if (change.kind === "retrying") console.log(change.attempt, change.delayMs, change.error);
        console.log(change.state);
      },
    });
  } catch (error) {
    if (error instanceof ResumeRefused) console.log(error.code, error.reason, error.closeCode);
    else if (error instanceof ReconnectFailed) console.log(error.attempts, error.lastError);
    throw error;
  }
  session.addEventListener("change", (event) => {
    const change = (event as CustomEvent<Change>).detail;
    console.log(change.kind, session.state, session.stats.replayedEvents);
  });
  const seq: number = await session.send({ type: "input.text.append", text: "hello" });
  await session.sendAudio(new Int16Array(320));
  await session.confirm();
  for await (const event of session) {
    const e: DuplexEvent = event;
    if (e.type === "response.output_audio.delta") console.log(audioBytes(e)?.length, seq);
    if (session.error instanceof ClientError) break;
  }
  const state: ResumeState = await session.detach();
  sessionStorage.setItem("trio-duplex", JSON.stringify(state));
  session.dropConnection();
  await session.close("bye");
  console.log(session.sessionId, session.generation, session.config, session.limits.max_event_bytes, session.url, session.resumeState());
}
