// What ioredis's defaults (tested with 6.1.0) and its two timeouts do to DLOCK.ACQUIRE … WAIT,
// and the settings docs/clients.md recommends. Prints `name=value` lines that tests/clients.rs
// checks. Usage: node timeouts_ioredis.cjs PORT
const Redis = require("ioredis");
const assert = require("node:assert/strict");
const { randomUUID } = require("node:crypto");
const { dlock } = require("./dlock_ioredis.cjs");

const port = Number(process.argv[2]);
const report = (name, value) => console.log(`${name}=${value}`);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function main() {
  const other = new Redis({ port });
  const count = async (name) => Number(new RegExp(`dlock_${name}:(\\d+)`).exec(await other.info("dlock"))[1]);
  const poll = async (probe, deadlineMs, what) => {
    const started = Date.now();
    while (!(await probe())) {
      if (Date.now() - started > deadlineMs) throw new Error(`${what}: not within ${deadlineMs} ms`);
      await sleep(5);
    }
    return Date.now() - started;
  };
  await other.call("DLOCK.ACQUIRE", "job:{io}", "holder", "60000");

  // Defaults: no timeout, so the server ends the wait; but the client has one connection, and
  // everything sent after the WAIT waits behind it.
  const client = new Redis({ port });
  let started = Date.now();
  const waited = client.call("DLOCK.ACQUIRE", "job:{io}", randomUUID(), "30000", "WAIT", "1000", "CLAIM", "1000");
  const pinged = client.ping().then(() => Date.now() - started);
  assert.equal(await waited, null);
  report("default_wait_elapsed_ms", Date.now() - started);
  report("default_ping_behind_wait_ms", await pinged);
  report("default_waits_started", await count("waits_started"));
  client.disconnect();

  // commandTimeout below the wait: the call fails, but the connection stays open and the server
  // keeps the waiter. A release then hands the lease to nobody who will read it: with CLAIM it
  // lapses after the claim window.
  const impatient = new Redis({ port, commandTimeout: 500 });
  const lapsedBefore = await count("claims_lapsed");
  started = Date.now();
  await assert.rejects(
    impatient.call("DLOCK.ACQUIRE", "job:{io}", randomUUID(), "30000", "WAIT", "2000", "CLAIM", "500"),
    /Command timed out/,
  );
  report("command_timeout_500_rejected_after_ms", Date.now() - started);
  report("command_timeout_500_waiters_after_rejection", await count("waiters"));
  await other.call("DLOCK.RELEASE", "job:{io}", "holder");
  const released = Date.now();
  await poll(async () => (await other.call("DLOCK.ACQUIRE", "job:{io}", "next", "30000")) !== null, 3000, "the unread hand-over lapses");
  report("command_timeout_500_free_again_after_ms", Date.now() - released);
  report("command_timeout_500_claims_lapsed", (await count("claims_lapsed")) - lapsedBefore);
  impatient.disconnect();

  // socketTimeout below the wait: the socket is destroyed and, by default
  // (autoResendUnfulfilledCommands), the same WAIT is sent again after every reconnect: one call,
  // a new wait in the server every socketTimeout, until the client is closed.
  const startedBefore = await count("waits_started");
  const resending = new Redis({ port, socketTimeout: 500 });
  resending.on("error", () => {});
  const call = resending.call("DLOCK.ACQUIRE", "job:{io}", randomUUID(), "30000", "WAIT", "2000", "CLAIM", "500");
  call.catch(() => {});
  await poll(async () => (await count("waits_started")) - startedBefore >= 3, 3000, "the WAIT is sent again");
  await poll(async () => (await count("waits_abandoned")) >= 2, 2000, "the server drops the earlier waiters");
  report("socket_timeout_500_waits_for_one_call", (await count("waits_started")) - startedBefore);
  report("socket_timeout_500_waits_abandoned", await count("waits_abandoned"));
  resending.disconnect();
  await assert.rejects(call, /Connection is closed/);
  await poll(async () => (await count("waiters")) === 0, 2000, "the last resent wait ends with its connection");
  await other.call("DLOCK.RELEASE", "job:{io}", "next");

  // Recommended: the WAIT on a connection of its own (duplicate()) whose commandTimeout is
  // above the wait and which re-sends nothing; CLAIM; the main client stays free meanwhile.
  await other.call("DLOCK.ACQUIRE", "job:{io}", "holder", "60000");
  const shared = new Redis({ port, autoResendUnfulfilledCommands: false });
  const waiter = shared.duplicate({ commandTimeout: 5000 + 5000 });
  const before = {};
  for (const name of ["waits_started", "waits_granted", "grants_claimed"]) before[name] = await count(name);
  const token = randomUUID();
  const granted = waiter.call("DLOCK.ACQUIRE", "job:{io}", token, "30000", "WAIT", "5000", "CLAIM", "2000");
  await poll(async () => (await count("waiters")) === 1, 2000, "the recommended WAIT blocks");
  const pingStarted = Date.now();
  await shared.ping();
  report("recommended_ping_during_wait_ms", Date.now() - pingStarted);
  await other.call("DLOCK.RELEASE", "job:{io}", "holder");
  const fence = await granted;
  assert.equal(typeof fence, "number");
  waiter.disconnect();
  // Claim: the same ACQUIRE again answers the same fence and starts the full ttl. (Sent with
  // dlock(), the Cluster fix, which works on a single server too.)
  assert.equal(await dlock(shared, "DLOCK.ACQUIRE", "job:{io}", token, "30000"), fence);
  for (const name of Object.keys(before)) report(`recommended_${name}`, (await count(name)) - before[name]);
  assert.equal(await dlock(shared, "DLOCK.RELEASE", "job:{io}", token), 1);
  shared.disconnect();
  other.disconnect();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
