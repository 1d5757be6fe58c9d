"""Phone calls over Twilio Media Streams (issue 29; docs/plans/telephony.md): the
server's side of a call, beside the session shell.

* ``tickets``: ``TwilioKeys``, the keys derived from the account's Auth Token, and what
  they make: the per-call ticket the TwiML carries (``v1.<o|r>.<exp>.<mac>``), the call's
  session id and its fixed resume token (derived from the CallSid, so any node can resume
  a call and nothing is stored per call), sans-IO;
* ``twiml``: the TwiML documents the ``/twiml`` endpoint answers (``<Connect><Stream>``
  with the ticket, then a ``<Redirect>`` back to us; ``<Hangup/>``), and the redirect's
  attempt count, sans-IO;
* ``marks`` and ``channel`` (the played frontier; the ``MessageTransport`` of one
  stream): plan §3.4 and §0.1.

The HTTP of the webhooks (form bodies, ``X-Twilio-Signature``, refusals) is
``server/front/twilio.py``'s.
"""
