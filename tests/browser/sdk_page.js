// OpenAI's Agents SDK in a browser (@openai/agents-realtime's UMD bundle, the global
// `OpenAIAgentsRealtime`), unchanged: its `OpenAIRealtimeWebRTC` transport pointed at
// trio-duplex's /v1/realtime/calls, with the fake microphone as its `mediaStream` and a
// client secret as its key. tests/browser/test_calls.py drives it through `window.sdk`.
"use strict";

window.sdk = (() => {
  const seen = {
    events: [], // every event the transport read ('*'), in order: {pc: 0, event}
    errors: [], // what its 'error' listeners heard
    connected: false, // connect() resolved
    callId: null,
    statuses: [], // its connection_change events
  };
  let transport = null;

  return {
    seen,
    async connect(base, secret) {
      const mic = await navigator.mediaDevices.getUserMedia({ audio: true });
      transport = new OpenAIAgentsRealtime.OpenAIRealtimeWebRTC({
        baseUrl: `${base}/v1/realtime/calls`,
        mediaStream: mic,
      });
      transport.on("*", (event) => seen.events.push({ pc: 0, event }));
      transport.on("error", (error) => seen.errors.push(JSON.stringify(error)));
      transport.on("connection_change", (status) => seen.statuses.push(status));
      await transport.connect({ apiKey: secret, model: "x" });
      seen.connected = true;
      seen.callId = transport.callId;
    },
    say: (text) => transport.sendMessage(text, {}),
    interrupt: () => transport.interrupt(),
    close: () => transport.close(),
    status: () => transport.status,
  };
})();
