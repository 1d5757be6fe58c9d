"""Phone calls over Twilio Media Streams (docs/plans/telephony.md)."""
