"""Built-in engines, by the name that ``--engine`` takes."""

BUILTIN = {
    "echo": "trio_duplex.engines.echo:EchoEngine",
    "voice": "trio_duplex.engines.voice:VoiceEngine",
}
