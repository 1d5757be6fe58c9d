// Socket.IO 4.8 load generator for scenario 7 (pipelined echo, or many idle connections).
//   node benchmarks/peer/client.js throughput --url ws://127.0.0.1:P --window 100 --warmup 0.5 --duration 2
//   node benchmarks/peer/client.js idle --url ws://127.0.0.1:P --count 10000 --open-concurrency 100
// Speaks the same stdout protocol as the Python load generators: "@mark NAME" lines, then
// one "@result {json}" line.
"use strict";
const { io } = require("socket.io-client");

const mode = process.argv[2];
const arg = (name, dflt) => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : dflt;
};
const url = arg("--url");
const TEXT = arg("--text", "x".repeat(100));
const now = () => Number(process.hrtime.bigint()) / 1e9;
const cpu = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
};
const mark = (name) => process.stdout.write(`@mark ${name}\n`);
const sleep = (s) => new Promise((r) => setTimeout(r, s * 1000));
// GET /gc on the server (the peer's server.js), so its RSS is sampled without garbage.
const serverGc = () =>
  new Promise((resolve) => {
    const u = new URL(url.replace(/^ws/, "http"));
    require("http")
      .get({ host: u.hostname, port: u.port, path: "/gc" }, (res) => {
        res.resume();
        res.on("end", resolve);
      })
      .on("error", resolve);
  });

function open() {
  return new Promise((resolve, reject) => {
    const socket = io(url, { transports: ["websocket"], forceNew: true, reconnection: false, timeout: 30000 });
    socket.once("connect", () => resolve(socket));
    socket.once("connect_error", (err) => reject(err));
  });
}

async function throughput() {
  const window = Number(arg("--window", "100"));
  const warmup = Number(arg("--warmup", "0.5"));
  const duration = Number(arg("--duration", "2"));
  const socket = await open();
  let received = 0;
  socket.on("output", () => {
    received += 1;
    socket.emit("input", TEXT);
  });
  for (let i = 0; i < window; i++) socket.emit("input", TEXT);
  await sleep(warmup);
  mark("window_start");
  const n0 = received, c0 = cpu(), t0 = now();
  await sleep(duration);
  const n1 = received, c1 = cpu(), t1 = now();
  mark("window_end");
  socket.disconnect();
  return { events: n1 - n0, seconds: t1 - t0, rate: (n1 - n0) / (t1 - t0), client_cpu: c1 - c0, recovered: socket.recovered };
}

async function idle() {
  const count = Number(arg("--count", "1000"));
  const concurrency = Number(arg("--open-concurrency", "100"));
  const settle = Number(arg("--settle", "1"));
  const sockets = [];
  const times = [];
  const failures = {};
  let next = 0;
  const gc = arg("--gc", "0") === "1";
  await sleep(0.2);
  if (gc) await serverGc();
  mark("before_open");
  const t0 = now();
  const limit = Number(arg("--open-time-limit", "60"));
  async function worker() {
    while (next < count && now() - t0 < limit) {
      next += 1;
      const s = now();
      try {
        sockets.push(await open());
        times.push(now() - s);
      } catch (err) {
        failures[err.message] = (failures[err.message] || 0) + 1;
      }
    }
  }
  await Promise.all(Array.from({ length: concurrency }, worker));
  const elapsed = now() - t0;
  mark("opened");
  await sleep(settle);
  if (gc) await serverGc();
  mark("settled");
  times.sort((a, b) => a - b);
  const pct = (q) => (times.length ? times[Math.min(times.length - 1, Math.floor((times.length - 1) * q))] * 1000 : null);
  return { count: times.length, wanted: count, open_seconds: elapsed, open_rate: times.length / elapsed, open_p50_ms: pct(0.5), open_p99_ms: pct(0.99), failures };
}

const maxTime = Number(arg("--max-time", "120"));
setTimeout(() => {
  console.error(`client.js: ${mode} ran past ${maxTime}s`);
  process.exit(3);
}, maxTime * 1000).unref();

({ throughput, idle })[mode]()
  .then((result) => {
    process.stdout.write(`@result ${JSON.stringify(result)}\n`);
    process.exit(0);
  })
  .catch((err) => {
    console.error(err && err.stack ? err.stack : String(err));
    process.exit(2);
  });
