// What node-redis's defaults (tested with 6.3.1) do to DLOCK.ACQUIRE … WAIT, and the settings
// docs/clients.md recommends. Prints `name=value` lines that tests/clients.rs checks.
// Usage: node timeouts_node_redis.cjs PORT
const { createClient } = require("redis");
const assert = require("node:assert/strict");
const { randomUUID } = require("node:crypto");

const url = `redis://127.0.0.1:${process.argv[2]}`;
const report = (name, value) => console.log(`${name}=${value}`);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function main() {
  const other = createClient({ url });
  await other.connect();
  const count = async (name) => {
    const match = new RegExp(`dlock_${name}:(\\d+)`).exec(await other.info("dlock"));
    return Number(match[1]);
  };
  const poll = async (probe, deadlineMs, what) => {
    const started = Date.now();
    while (!(await probe())) {
      if (Date.now() - started > deadlineMs) throw new Error(`${what}: not within ${deadlineMs} ms`);
      await sleep(5);
    }
  };
  await other.sendCommand(["DLOCK.ACQUIRE", "job:{node}", "holder", "60000"]);

  // Defaults: no timeout on a sent command, so the server ends the wait; but the client has one
  // connection, and everything sent after the WAIT waits behind it.
  const client = createClient({ url });
  await client.connect();
  let started = Date.now();
  const waited = client.sendCommand(["DLOCK.ACQUIRE", "job:{node}", randomUUID(), "30000", "WAIT", "1000", "CLAIM", "1000"]);
  const pinged = client.ping().then(() => Date.now() - started);
  assert.equal(await waited, null);
  report("default_wait_elapsed_ms", Date.now() - started);
  report("default_ping_behind_wait_ms", await pinged);
  report("default_waits_started", await count("waits_started"));

  // The per-command `timeout` option covers only the time before the command is written: it
  // never cuts a WAIT the server already has.
  started = Date.now();
  const reply = await client.sendCommand(["DLOCK.ACQUIRE", "job:{node}", randomUUID(), "30000", "WAIT", "1000", "CLAIM", "1000"], { timeout: 200 });
  assert.equal(reply, null);
  report("command_timeout_200_wait_elapsed_ms", Date.now() - started);
  await client.close();

  // socket.socketTimeout (off by default) does cut it: the socket is destroyed, the server drops
  // the waiter (no grant can go to it), and the client reconnects.
  const cut = createClient({ url, socket: { socketTimeout: 500 } });
  cut.on("error", () => {});
  await cut.connect();
  const abandonedBefore = await count("waits_abandoned");
  started = Date.now();
  await assert.rejects(
    cut.sendCommand(["DLOCK.ACQUIRE", "job:{node}", randomUUID(), "30000", "WAIT", "2000", "CLAIM", "1000"]),
    (error) => error.constructor.name === "SocketTimeoutError",
  );
  report("socket_timeout_500_rejected_after_ms", Date.now() - started);
  await poll(async () => (await count("waits_abandoned")) === abandonedBefore + 1, 2000, "the server drops the waiter");
  report("socket_timeout_500_waits_abandoned", (await count("waits_abandoned")) - abandonedBefore);
  await cut.destroy();

  // Recommended: the WAIT on a connection of its own (duplicate()), no socketTimeout below the
  // wait, CLAIM; the main client stays free meanwhile.
  const main = createClient({ url });
  await main.connect();
  const waiter = main.duplicate();
  await waiter.connect();
  const before = {};
  for (const name of ["waits_started", "waits_granted", "grants_claimed"]) before[name] = await count(name);
  const token = randomUUID();
  started = Date.now();
  const granted = waiter.sendCommand(["DLOCK.ACQUIRE", "job:{node}", token, "30000", "WAIT", "5000", "CLAIM", "2000"]);
  await poll(async () => (await count("waiters")) === 1, 2000, "the recommended WAIT blocks");
  const pingStarted = Date.now();
  await main.ping();
  report("recommended_ping_during_wait_ms", Date.now() - pingStarted);
  await other.sendCommand(["DLOCK.RELEASE", "job:{node}", "holder"]);
  const fence = await granted;
  assert.equal(typeof fence, "number");
  await waiter.close();
  // Claim: the same ACQUIRE again answers the same fence and starts the full ttl.
  assert.equal(await main.sendCommand(["DLOCK.ACQUIRE", "job:{node}", token, "30000"]), fence);
  for (const name of Object.keys(before)) report(`recommended_${name}`, (await count(name)) - before[name]);
  assert.equal(await main.sendCommand(["DLOCK.RELEASE", "job:{node}", token]), 1);
  await main.close();
  await other.close();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
