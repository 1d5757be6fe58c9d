// Shared by the tests: the servers they run against, and a cutting TCP proxy.
//
// The harness (tests/js/test_node_client.py) starts the servers and names them in the
// environment: TRIO_DUPLEX_URL (echo engine, no authentication), TRIO_DUPLEX_AUTH_URL
// (echo engine with --api-key-file and a small --max-event-bytes) and
// TRIO_DUPLEX_API_KEY (a key it accepts). Without them (`npm test` alone), each test
// file starts its own servers with `python3 -m trio_duplex serve` (TRIO_DUPLEX_PYTHON
// names another interpreter), on free ports, and stops them when it ends.

import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after } from "node:test";

export const API_KEY = process.env.TRIO_DUPLEX_API_KEY ?? "js-test-key-0123456789";
export const MAX_EVENT_BYTES = 100_000; // the auth server's --max-event-bytes

/** The server's ready line: `serving ws://HOST:PORT/PATH (engine ...)`. */
const READY = /serving (wss?:\/\/\S+)/;

/** Start `trio-duplex serve` with `args` on a free port; resolves with its URL. */
export function startServer(args, timeoutMs = 20000) {
  const python = process.env.TRIO_DUPLEX_PYTHON ?? "python3";
  const proc = spawn(python, ["-m", "trio_duplex", "serve", "--port", "0", ...args], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  // Stopped when this test process exits; unreferenced, so that it does not keep the
  // process alive (node:test's after() inside a before() hook would stop it at once).
  process.on("exit", () => proc.kill());
  proc.unref();
  proc.stderr.unref();
  let log = "";
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no ready line within ${timeoutMs} ms:\n${log}`)), timeoutMs);
    proc.stderr.setEncoding("utf8");
    proc.stderr.on("data", (chunk) => {
      log += chunk;
      const match = READY.exec(log);
      if (match) {
        clearTimeout(timer);
        resolve({ url: match[1], proc });
      }
    });
    proc.on("exit", (code) => reject(new Error(`server exited (${code}) before its ready line:\n${log}`)));
  });
}

/** The echo server without authentication. */
export async function echoUrl() {
  if (process.env.TRIO_DUPLEX_URL) return process.env.TRIO_DUPLEX_URL;
  return (await startServer([])).url;
}

/** The echo server with --api-key-file (API_KEY) and --max-event-bytes MAX_EVENT_BYTES. */
export async function authUrl() {
  if (process.env.TRIO_DUPLEX_AUTH_URL) return process.env.TRIO_DUPLEX_AUTH_URL;
  const dir = mkdtempSync(join(tmpdir(), "trio-duplex-js-"));
  const keys = join(dir, "keys");
  writeFileSync(keys, `js-tests:${API_KEY}\n`);
  return (await startServer(["--api-key-file", keys, "--max-event-bytes", String(MAX_EVENT_BYTES)])).url;
}

/** Resolves once `predicate()` holds, polling every few ms; rejects after `timeoutMs`. */
export async function until(predicate, what, timeoutMs = 10000) {
  const deadline = Date.now() + timeoutMs;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/** A small seeded PRNG (mulberry32): the proxy's faults are reproducible from a seed. */
export function seeded(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * A TCP proxy on 127.0.0.1 that forwards to `target` (a ws:// URL's host and port) and
 * hurts connections, as tests/client/proxy.py does for the Python client:
 * - mode "cut": while fewer than `maxCuts` connections were cut, each new one dies
 *   after a random budget of forwarded bytes (both directions counted; minBytes..maxBytes, so
 *   often inside the HTTP upgrade or mid-frame), by a FIN or, at random, a RST, both
 *   sides at once. After that every connection is clean.
 * - mode "stall": the first `maxCuts` connections stop forwarding the server's bytes
 *   after the budget (minBytes..maxBytes of them), and stay open: a silent server, which only a heartbeat deadline
 *   can tell from a quiet one.
 * Returns {url, cuts, connections, close()}: `url` is the target URL through the proxy.
 */
export async function startProxy(targetUrl, { seed, maxCuts, minBytes = 1, maxBytes = 6000, mode = "cut" }) {
  const target = new URL(targetUrl);
  const random = seeded(seed);
  const sockets = new Set();
  const proxy = { url: "", cuts: 0, connections: 0, close: () => {} };
  const server = net.createServer((down) => {
    proxy.connections += 1;
    const doomed = proxy.cuts < maxCuts;
    if (doomed) proxy.cuts += 1;
    let budget = doomed ? minBytes + Math.floor(random() * (maxBytes - minBytes + 1)) : Infinity;
    const rst = random() < 0.5;
    const up = net.connect(Number(target.port), target.hostname);
    for (const socket of [down, up]) {
      sockets.add(socket);
      socket.on("close", () => sockets.delete(socket));
      socket.on("error", () => {}); // a cut is the point
    }
    let dead = false;
    let stalled = false;
    const kill = () => {
      if (dead) return;
      dead = true;
      for (const socket of [down, up]) {
        if (rst) socket.resetAndDestroy();
        else socket.end(() => socket.destroy());
      }
    };
    /** @param {net.Socket} from @param {net.Socket} to @param {boolean} fromServer */
    const pump = (from, to, fromServer) => {
      from.on("data", (chunk) => {
        if (dead) return;
        if (mode === "stall" && !fromServer) {
          to.write(chunk); // the client's bytes always flow
          return;
        }
        if (stalled) return;
        if (chunk.length >= budget) {
          to.write(chunk.subarray(0, budget));
          budget = 0;
          if (mode === "stall") stalled = true; // the server's bytes stop, the socket stays
          else kill();
          return;
        }
        budget -= chunk.length;
        to.write(chunk);
      });
      from.on("end", () => !dead && to.end());
      from.on("close", () => !dead && to.destroy());
    };
    pump(down, up, false);
    pump(up, down, true);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = /** @type {net.AddressInfo} */ (server.address());
  proxy.url = `${target.protocol}//127.0.0.1:${address.port}${target.pathname}${target.search}`;
  proxy.close = () => {
    server.close();
    for (const socket of sockets) socket.destroy();
  };
  after(() => proxy.close());
  return proxy;
}
