from trio_duplex.testing import running_server


async def test_open_echo_resume(autojump_clock: object) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session({"voice": "x"})
        await client.send({"type": "input.text.append", "text": "hi", "client_event_seq": 1})
        echoed = await client.receive()
        assert echoed == {"type": "response.output_text.delta", "text": "hi", "server_event_seq": 1}
        await client.transport.cut()
        client2, resumed = await sim.resume(created["session_id"], created["resume_token"], 0)
        assert resumed["type"] == "session.resumed"
        assert resumed["attachment_generation"] == 2
        assert resumed["last_received_client_event_seq"] == 1
        assert (await client2.receive())["server_event_seq"] == 1
        await client2.send({"type": "session.close"})
        closed = await client2.receive_until_closed()
        assert closed[-1]["type"] == "session.closed"
        assert client2.close_code == 1000
        assert sim.server.slots_held == 0
