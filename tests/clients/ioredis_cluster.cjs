// ioredis's Redis.Cluster (tested with 6.1.0) and dlock's commands: through `call` they go to a
// random primary first; through `dlock` (dlock_ioredis.cjs) to the resource's primary. Counts,
// on the servers, the MOVED answers and the slot map refreshes (CLUSTER SLOTS) of each way.
// Prints `name=value` lines that tests/clients.rs checks. Usage: node ioredis_cluster.cjs PORT...
const Redis = require("ioredis");
const assert = require("node:assert/strict");
const { randomUUID } = require("node:crypto");
const { dlock } = require("./dlock_ioredis.cjs");

const ports = process.argv.slice(2).map(Number);
const report = (name, value) => console.log(`${name}=${value}`);
const RESOURCES = 30;

/// Summed over every node: dlock's commands run and refused with a redirect (on primaries:
/// replicas run what their primary replicates), and CLUSTER SLOTS.
async function serverCounts(nodes) {
  const counts = { calls: 0, moved: 0, refreshes: 0 };
  for (const node of nodes) {
    const primary = (await node.info("replication")).includes("role:master");
    for (const line of (await node.info("commandstats")).split("\r\n")) {
      const stat = /^cmdstat_([^:]+):calls=(\d+),.*rejected_calls=(\d+)/.exec(line);
      if (!stat) continue;
      if (stat[1].startsWith("dlock.") && primary) {
        counts.calls += Number(stat[2]);
        counts.moved += Number(stat[3]);
      } else if (stat[1] === "cluster|slots") {
        counts.refreshes += Number(stat[2]);
      }
    }
  }
  return counts;
}

/// The lifecycle on RESOURCES resources spread over the slots, then a wait and its hand-over,
/// all sent with `send(client)(name, ...args)`; answers how many commands were sent.
async function lifecycles(send, cluster, waiter, waiting) {
  let sent = 0;
  const run = async (client, ...command) => {
    sent += 1;
    return send(client)(...command);
  };
  for (let i = 0; i < RESOURCES; i++) {
    const resource = `job:{${i}}`;
    const token = randomUUID();
    const fence = await run(cluster, "DLOCK.ACQUIRE", resource, token, "30000");
    assert.equal(typeof fence, "number");
    assert.equal(await run(cluster, "DLOCK.RENEW", resource, token, "30000"), 1);
    assert.equal(await run(cluster, "DLOCK.FENCECHECK", resource, String(fence)), 1);
    assert.equal(await run(cluster, "DLOCK.FENCED", resource, String(fence), "SET", `${resource}:data`, "done"), "OK");
    assert.equal(await run(cluster, "DLOCK.RELEASE", resource, token), 1);
  }
  const token = randomUUID();
  assert.equal(typeof (await run(cluster, "DLOCK.ACQUIRE", "job:{wait}", "holder", "60000")), "number");
  const granted = run(waiter, "DLOCK.ACQUIRE", "job:{wait}", token, "30000", "WAIT", "5000", "CLAIM", "2000");
  const deadline = Date.now() + 3000;
  while ((await waiting()) !== 1) {
    assert.ok(Date.now() < deadline, "the WAIT blocks");
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  assert.equal(await run(cluster, "DLOCK.RELEASE", "job:{wait}", "holder"), 1);
  const fence = await granted;
  assert.equal(typeof fence, "number");
  assert.equal(await run(cluster, "DLOCK.ACQUIRE", "job:{wait}", token, "30000"), fence);
  assert.equal(await run(cluster, "DLOCK.RELEASE", "job:{wait}", token), 1);
  return sent;
}

async function main() {
  // Plain connections to every node, apart from the clusters under test.
  const nodes = ports.map((port) => new Redis({ port }));
  const waiting = async () => {
    let waiters = 0;
    for (const node of nodes) waiters += Number(/dlock_waiters:(\d+)/.exec(await node.info("dlock"))[1]);
    return waiters;
  };
  for (const [mode, send] of [
    ["call", (client) => (...command) => client.call(...command)],
    ["keyed", (client) => (...command) => dlock(client, ...command)],
  ]) {
    const cluster = new Redis.Cluster([{ host: "127.0.0.1", port: ports[0] }]);
    // A second client for the WAIT, which blocks its connection; its timeout above the wait.
    const waiter = cluster.duplicate([], { redisOptions: { commandTimeout: 10000 } });
    for (const client of [cluster, waiter]) {
      if (client.status !== "ready") await new Promise((resolve) => client.once("ready", resolve));
    }
    const before = await serverCounts(nodes);
    const sent = await lifecycles(send, cluster, waiter, waiting);
    const after = await serverCounts(nodes);
    report(`${mode}_sent`, sent);
    for (const name of ["calls", "moved", "refreshes"]) report(`${mode}_${name}`, after[name] - before[name]);
    waiter.disconnect();
    cluster.disconnect();
  }
  for (const node of nodes) node.disconnect();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
