// A server with --api-key-file: the credential goes as the subprotocol
// trio-duplex.bearer.TOKEN (what a browser can send), a resume presents the resume
// token the same way, and a refused credential is a failed handshake.

import assert from "node:assert/strict";
import { before, test } from "node:test";

import { ReconnectFailed, connect } from "../src/trio-duplex.js";
import { API_KEY, authUrl } from "./helpers.js";

let URL_;
before(async () => {
  URL_ = await authUrl();
});

const FAST = { baseDelayMs: 10, maxDelayMs: 50 };

test("an API key as the bearer subprotocol opens; the resume token resumes", async () => {
  const session = await connect(URL_, { token: API_KEY, reconnect: FAST });
  await session.send({ type: "input.text.append", text: "hello" });
  assert.equal((await session.receive()).text, "hello");
  session.dropConnection(); // the resume presents the resume token, not the key
  await session.send({ type: "input.text.append", text: "again" });
  assert.equal((await session.receive()).text, "again");
  assert.equal(session.stats.resumes, 1);
  const state = await session.detach();
  const resumed = await connect(URL_, { resume: state }); // no API key needed
  await resumed.send({ type: "input.text.append", text: "third" });
  const echo = await resumed.receive();
  assert.deepEqual([echo.server_event_seq, echo.text], [3, "third"]);
  await resumed.close();
});

test("a client token from POST /v1/client_tokens opens one session", async () => {
  const http = URL_.replace(/^ws/, "http").replace(/\/v1\/duplex.*$/, "/v1/client_tokens");
  const answer = await fetch(http, {
    method: "POST",
    headers: { authorization: `Bearer ${API_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ ttl_s: 30 }),
  });
  assert.equal(answer.status, 200);
  const { token } = await answer.json();
  const session = await connect(URL_, { token });
  await session.send({ type: "input.text.append", text: "from a page" });
  assert.equal((await session.receive()).text, "from a page");
  await session.close();
  // Spent: a second open with it is refused like any wrong credential.
  await assert.rejects(
    connect(URL_, { token, reconnect: { retryOpen: false } }),
    (e) => e instanceof ReconnectFailed && e.attempts === 1,
  );
});

for (const token of [undefined, "wrong-key"]) {
  test(`a refused credential (${token ?? "none"}): ReconnectFailed, the upgrade failed`, async () => {
    const error = await connect(URL_, { token, reconnect: { retryOpen: false } }).then(
      () => assert.fail("connected"),
      (e) => e,
    );
    assert.ok(error instanceof ReconnectFailed, String(error));
    assert.equal(error.attempts, 1);
    assert.match(error.lastError, /handshake failed/);
  });
}
