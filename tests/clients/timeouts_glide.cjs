// What valkey-glide's defaults (the Node client, tested with 2.5.2) do to DLOCK.ACQUIRE … WAIT,
// and the settings docs/clients.md recommends. Prints `name=value` lines that tests/clients.rs
// checks. Usage: node timeouts_glide.cjs PORT
const { GlideClient, Logger } = require("@valkey/valkey-glide");
const assert = require("node:assert/strict");
const { randomUUID } = require("node:crypto");

// Glide logs every request timeout as a warning; the timeouts here are on purpose.
Logger.setLoggerConfig("error");
const addresses = [{ host: "127.0.0.1", port: Number(process.argv[2]) }];
const report = (name, value) => console.log(`${name}=${value}`);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
/// DLOCK.INFO's fields: glide answers a RESP3 map as a list of { key, value }.
const fieldsOf = (reply) => (reply === null ? null : Object.fromEntries(reply.map(({ key, value }) => [key, value])));

async function main() {
  const other = await GlideClient.createClient({ addresses });
  const count = async (name) => Number(new RegExp(`dlock_${name}:(\\d+)`).exec(await other.customCommand(["INFO", "dlock"]))[1]);
  const clients = async () => Number(/connected_clients:(\d+)/.exec(await other.customCommand(["INFO", "clients"]))[1]);
  const poll = async (probe, deadlineMs, what) => {
    const started = Date.now();
    while (!(await probe())) {
      if (Date.now() - started > deadlineMs) throw new Error(`${what}: not within ${deadlineMs} ms`);
      await sleep(5);
    }
  };
  await other.customCommand(["DLOCK.ACQUIRE", "job:{glide}", "holder", "60000"]);

  // Defaults: requestTimeout 250 ms. The call fails, the connection stays open (one connection,
  // multiplexed), and the server keeps the waiter: everything else this client sends waits
  // behind the WAIT and times out too.
  const client = await GlideClient.createClient({ addresses });
  const connected = await clients();
  const lapsedBefore = await count("claims_lapsed");
  let started = Date.now();
  await assert.rejects(
    client.customCommand(["DLOCK.ACQUIRE", "job:{glide}", randomUUID(), "30000", "WAIT", "2000", "CLAIM", "500"]),
    (error) => error.constructor.name === "TimeoutError",
  );
  report("default_rejected_after_ms", Date.now() - started);
  report("default_waiters_after_rejection", await count("waiters"));
  report("default_waits_abandoned", await count("waits_abandoned"));
  report("default_connections_closed", connected - (await clients()));
  started = Date.now();
  await assert.rejects(client.customCommand(["PING"]), (error) => error.constructor.name === "TimeoutError");
  report("default_ping_behind_wait_rejected_after_ms", Date.now() - started);
  // The release hands the lease to the wait nobody reads any more; CLAIM 500 makes it lapse.
  await other.customCommand(["DLOCK.RELEASE", "job:{glide}", "holder"]);
  const released = Date.now();
  await poll(async () => (await other.customCommand(["DLOCK.ACQUIRE", "job:{glide}", "next", "30000"])) !== null, 3000, "the unread hand-over lapses");
  report("default_claim_500_free_again_after_ms", Date.now() - released);
  report("default_claim_500_claims_lapsed", (await count("claims_lapsed")) - lapsedBefore);

  // The same without CLAIM: the unread hand-over holds the resource for the full ttl, until the
  // token is released (docs/clients.md: after a failed wait, release the token).
  const token = randomUUID();
  await assert.rejects(client.customCommand(["DLOCK.ACQUIRE", "job:{glide}", token, "30000", "WAIT", "2000"]));
  await other.customCommand(["DLOCK.RELEASE", "job:{glide}", "next"]);
  await poll(async () => (await count("waiters")) === 0, 2000, "the hand-over");
  const stuck = fieldsOf(await other.customCommand(["DLOCK.INFO", "job:{glide}"]));
  assert.equal(String(stuck.owner), token);
  report("no_claim_handover_ttl_ms", stuck["ttl-ms"]);
  assert.equal(await client.customCommand(["DLOCK.RELEASE", "job:{glide}", token]), 1);

  // Recommended for a shared glide client: a QUEUE ticket. The ACQUIRE answers at once, the
  // client stays free, and the ticket is re-sent (well within ticket-ms) until it answers a fence.
  await other.customCommand(["DLOCK.ACQUIRE", "job:{glide}", "holder", "60000"]);
  const before = {};
  for (const name of ["waits_started", "tickets_queued", "tickets_granted", "grants_claimed"]) before[name] = await count(name);
  const ticket = randomUUID();
  const acquire = () => client.customCommand(["DLOCK.ACQUIRE", "job:{glide}", ticket, "30000", "QUEUE", "2000", "CLAIM", "2000"]);
  started = Date.now();
  assert.equal(await acquire(), null);
  report("queue_first_reply_ms", Date.now() - started);
  started = Date.now();
  assert.equal(await client.customCommand(["PING"]), "PONG");
  report("queue_ping_ms", Date.now() - started);
  await other.customCommand(["DLOCK.RELEASE", "job:{glide}", "holder"]);
  let fence = null;
  await poll(async () => (fence = await acquire()) !== null, 3000, "the ticket's turn");
  assert.equal(typeof fence, "number");
  for (const name of Object.keys(before)) report(`queue_${name}`, (await count(name)) - before[name]);
  assert.equal(await client.customCommand(["DLOCK.RELEASE", "job:{glide}", ticket]), 1);

  // Or a client of its own for waits, its requestTimeout above the wait; CLAIM all the same.
  const WAIT_MS = 5000;
  const waiter = await GlideClient.createClient({ addresses, requestTimeout: WAIT_MS + 1000 });
  await other.customCommand(["DLOCK.ACQUIRE", "job:{glide}", "holder", "60000"]);
  for (const name of ["waits_started", "waits_granted", "grants_claimed"]) before[name] = await count(name);
  const waitToken = randomUUID();
  const granted = waiter.customCommand(["DLOCK.ACQUIRE", "job:{glide}", waitToken, "30000", "WAIT", String(WAIT_MS), "CLAIM", "2000"]);
  await poll(async () => (await count("waiters")) === 1, 2000, "the dedicated client's WAIT blocks");
  await other.customCommand(["DLOCK.RELEASE", "job:{glide}", "holder"]);
  fence = await granted;
  assert.equal(typeof fence, "number");
  // Claim: the same ACQUIRE again answers the same fence and starts the full ttl.
  assert.equal(await client.customCommand(["DLOCK.ACQUIRE", "job:{glide}", waitToken, "30000"]), fence);
  for (const name of ["waits_started", "waits_granted", "grants_claimed"]) report(`dedicated_${name}`, (await count(name)) - before[name]);
  assert.equal(await client.customCommand(["DLOCK.RELEASE", "job:{glide}", waitToken]), 1);
  waiter.close();
  client.close();
  other.close();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
