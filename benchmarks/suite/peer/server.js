// Socket.IO 4.8 echo server with connectionStateRecovery: the peer of scenario 7.
//   node benchmarks/peer/server.js --port 8003
// Every "input" event comes back as an "output" event. With connectionStateRecovery on,
// socket.emit goes through the session-aware adapter, which gives each packet an offset
// and keeps it for replay: the peer's counterpart of our journal.
// GET /gc runs a full collection (when started with --expose-gc) and answers
// process.memoryUsage(), so that RSS is sampled without garbage in it.
"use strict";
const http = require("http");
const { Server } = require("socket.io");

const arg = (name, dflt) => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : dflt;
};
const host = arg("--host", "127.0.0.1");
const port = Number(arg("--port", "0"));

const httpServer = http.createServer((req, res) => {
  if (req.url === "/gc") {
    if (global.gc) global.gc();
    res.setHeader("content-type", "application/json");
    res.end(JSON.stringify(process.memoryUsage()));
    return;
  }
  res.writeHead(404);
  res.end();
});

const io = new Server(httpServer, {
  transports: ["websocket"],
  perMessageDeflate: false,
  maxHttpBufferSize: 16 * 1024 * 1024,
  connectionStateRecovery: { maxDisconnectionDuration: 30000, skipMiddlewares: true },
});

io.on("connection", (socket) => {
  socket.on("input", (text) => socket.emit("output", text));
});

httpServer.listen(port, host, () => {
  const bound = httpServer.address().port;
  console.error(`socket.io ${require("socket.io/package.json").version} echo on ws://${host}:${bound}/socket.io/`);
});

for (const sig of ["SIGTERM", "SIGINT"]) {
  process.on(sig, () => {
    io.close();
    process.exit(0);
  });
}
