// Starts the SQS emulator (local-aws-sqs) for the adapters/sqs tests on a
// loopback port: node server.js [port] (default 0, a free one). It prints
// "listening <port>" once it takes requests, and exits when its standard
// input closes, so that an emulator started by a test binary that died
// does not outlive it.
"use strict";
const { createSqsServer } = require("local-aws-sqs");

const port = Number(process.argv[2] || 0);
createSqsServer({
  port,
  hostname: "127.0.0.1",
  // Tests create queues under unique names; no 60 s wait on a name.
  emulateQueueCreationLifecycle: false,
}).then((server) => {
  process.stdout.write(`listening ${server.address().port}\n`);
});
process.stdin.on("end", () => process.exit(0));
process.stdin.resume();
