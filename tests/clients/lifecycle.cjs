// The whole dlock lifecycle from node-redis; fences must reach JavaScript exactly.
// Usage: node lifecycle.cjs PORT
const { createClient } = require("redis");
const assert = require("node:assert/strict");

(async () => {
  const client = createClient({ url: `redis://127.0.0.1:${process.argv[2]}` });
  await client.connect();
  const resource = "invoice:{node}";
  const fence = await client.sendCommand(["DLOCK.ACQUIRE", resource, "node-worker", "30000"]);
  assert.equal(typeof fence, "number");
  assert.ok(Number.isSafeInteger(fence), `fence ${fence} is exact in a JavaScript number`);
  assert.equal(await client.sendCommand(["DLOCK.ACQUIRE", resource, "other", "30000"]), null);
  assert.equal(await client.sendCommand(["DLOCK.RENEW", resource, "node-worker", "30000"]), 1);
  // The server confirms the number JavaScript holds is the very fence it minted.
  assert.equal(await client.sendCommand(["DLOCK.FENCECHECK", resource, String(fence)]), 1);
  const added = await client.sendCommand(["DLOCK.FENCED", resource, String(fence), "HSET", `${resource}:data`, "status", "paid"]);
  assert.equal(added, 1);
  await assert.rejects(
    client.sendCommand(["DLOCK.FENCED", resource, String(fence + 1), "HSET", `${resource}:data`, "status", "stale"]),
    /STALE/,
  );
  const info = await client.sendCommand(["DLOCK.INFO", resource]);
  const fields = Object.fromEntries(info.reduce((pairs, v, i) => (i % 2 ? pairs[pairs.length - 1].push(v) : pairs.push([v]), pairs), []));
  assert.equal(fields.owner, "node-worker");
  assert.equal(fields.fence, fence);
  assert.equal(await client.sendCommand(["DLOCK.RELEASE", resource, "node-worker"]), 1);
  await client.quit();
  console.log("node-redis: OK");
})().catch((error) => {
  console.error(error);
  process.exit(1);
});
