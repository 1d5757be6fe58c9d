"""WebRTC calls (OpenAI's ``/v1/realtime/calls`` flow; docs/plans/webrtc.md): the shell
of one call, between the session shell and the media link (``media/port.py``).

* ``channel``: ``CallChannel``, a ``MessageTransport`` over one call: the data
  channel's text both ways, the microphone in as the binary lane's input audio, the
  output audio out as Opus packets, bounded by the worker's credits;
* ``playout``: ``Playout``, what the client is told of its audio's playback
  (``output_audio_buffer.*``), sans-IO;
* ``sdp``: the offers a call takes (Opus audio, a data channel) without the candidates
  aioice must not use, and the answer's advertised candidates (``--call-advertise``),
  sans-IO.
"""
