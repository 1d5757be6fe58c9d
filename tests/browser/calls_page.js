// OpenAI's WebRTC flow, as a browser page makes it without any SDK: a peer connection with
// the `oai-events` data channel and the microphone's track, its offer POSTed to
// /v1/realtime/calls with a client secret, the answer set; events in and out on the data
// channel; the reply's track played (unmuted: Chromium's inbound-rtp `totalAudioEnergy`
// counts only audio played out, docs/plans/webrtc.md §1.4). A resume is a new peer
// connection whose offer goes to `?resume=SESSION_ID&last_received_server_event_seq=N`
// with the resume token. tests/browser/test_calls.py drives it through `window.calls`.
"use strict";

window.calls = (() => {
  const seen = {
    events: [], // every data-channel event, in order: {pc, event}
    posts: [], // every POST's answer: {status, contentType, location, error}
    pcs: 0, // peer connections made
    resume: null, // session.created's resume object, then session.resumed's token
    lastSeq: 0, // the highest server_event_seq seen (what a resume asks after)
    closedAt: null, // the event the page closed its peer connection on: {type, seq}
    closeOn: null, // event types that close the peer connection when one arrives
    inbound: {}, // the current peer connection's inbound-rtp audio stats (watchInbound)
  };
  let pc = null;
  let dc = null;
  let audio = null;
  let mic = null;

  function received(index, data) {
    const event = JSON.parse(data);
    seen.events.push({ pc: index, event });
    if (typeof event.server_event_seq === "number") {
      seen.lastSeq = Math.max(seen.lastSeq, event.server_event_seq);
    }
    if (event.type === "session.created") {
      seen.resume = { ...event.resume };
    } else if (event.type === "session.resumed") {
      seen.resume = { ...seen.resume, resume_token: event.resume_token };
    }
    if (seen.closeOn !== null && seen.closeOn.includes(event.type)) {
      // At once, in the handler: no later event of this pc reaches the page.
      seen.closeOn = null;
      seen.closedAt = { type: event.type, seq: event.server_event_seq };
      hangUpLocally();
    }
  }

  function hangUpLocally() {
    pc.close();
    if (audio !== null) {
      audio.srcObject = null;
      audio.remove();
      audio = null;
    }
  }

  async function open(base, credential, query) {
    const index = seen.pcs++;
    pc = new RTCPeerConnection();
    dc = pc.createDataChannel("oai-events");
    dc.onmessage = (e) => received(index, e.data);
    const opened = new Promise((resolve) => {
      dc.onopen = resolve;
    });
    pc.ontrack = (e) => {
      audio = new Audio();
      audio.autoplay = true;
      audio.srcObject = e.streams[0] || new MediaStream([e.track]);
      document.body.appendChild(audio);
    };
    if (mic === null) {
      mic = await navigator.mediaDevices.getUserMedia({ audio: true });
    }
    pc.addTrack(mic.getAudioTracks()[0], mic);
    const offer = await pc.createOffer();
    await pc.setLocalDescription(offer);
    // What the agents SDK posts: createOffer's SDP (no candidates yet).
    const answer = await fetch(`${base}/v1/realtime/calls${query}`, {
      method: "POST",
      body: offer.sdp,
      headers: { "Content-Type": "application/sdp", Authorization: `Bearer ${credential}` },
    });
    const body = await answer.text();
    const post = {
      status: answer.status,
      contentType: answer.headers.get("Content-Type"),
      location: answer.headers.get("Location"),
      error: null,
    };
    seen.posts.push(post);
    if (answer.status !== 201) {
      post.error = body;
      return post;
    }
    await pc.setRemoteDescription({ type: "answer", sdp: body });
    await opened;
    return post;
  }

  return {
    seen,
    /** A call: a new peer connection, its offer POSTed with the client secret. */
    start: (base, secret) => open(base, secret, ""),
    /** A resume: a new peer connection, its offer POSTed with the resume token. */
    resume(base) {
      const query =
        `?resume=${encodeURIComponent(seen.resume.session_id)}` +
        `&last_received_server_event_seq=${seen.lastSeq}`;
      return open(base, seen.resume.resume_token, query);
    },
    send(event) {
      dc.send(JSON.stringify(event));
    },
    /** A typed user turn and the response.create that answers it. */
    say(text) {
      this.send({
        type: "conversation.item.create",
        item: { type: "message", role: "user", content: [{ type: "input_text", text }] },
      });
      this.send({ type: "response.create" });
    },
    /** Close the peer connection as soon as an event of one of `types` arrives. */
    closeOn(types) {
      seen.closeOn = types;
    },
    pcState: () => (pc === null ? null : pc.connectionState),
    /** Keep `seen.inbound` up to date with the current peer connection's inbound-rtp
     * audio stats (no event says they changed: polled, every 100 ms). */
    watchInbound() {
      setInterval(async () => {
        if (pc.connectionState === "closed") {
          return; // (between a hang-up and the resume: the closed one has no new stats)
        }
        const stats = {};
        (await pc.getStats()).forEach((s) => {
          if (s.type === "inbound-rtp" && s.kind === "audio") {
            Object.assign(stats, {
              energy: s.totalAudioEnergy,
              samples: s.totalSamplesReceived,
              packets: s.packetsReceived,
              lost: s.packetsLost,
            });
          }
        });
        seen.inbound = stats;
      }, 100);
    },
  };
})();
