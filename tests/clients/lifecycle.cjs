// The whole dlock lifecycle from node-redis (tested with 6.3.1), under RESP2 and RESP3; fences
// must reach JavaScript exactly. Usage: node lifecycle.cjs PORT
const { createClient } = require("redis");
const assert = require("node:assert/strict");

/// DLOCK.INFO's fields, whether they came as a flat array (RESP2) or as a map (RESP3).
function fieldsOf(info) {
  if (Array.isArray(info)) {
    const fields = {};
    for (let i = 0; i < info.length; i += 2) fields[info[i]] = info[i + 1];
    return fields;
  }
  return info instanceof Map ? Object.fromEntries(info) : info;
}

async function lifecycle(protocol) {
  const client = createClient({ url: `redis://127.0.0.1:${process.argv[2]}`, RESP: protocol });
  await client.connect();
  const resource = `invoice:{node${protocol}}`;
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
    // The snippets in docs/clients.md test for a STALE refusal exactly this way.
    (error) => error.message.startsWith("STALE"),
  );
  const fields = fieldsOf(await client.sendCommand(["DLOCK.INFO", resource]));
  assert.equal(fields.owner, "node-worker");
  assert.equal(fields.fence, fence);
  assert.equal(await client.sendCommand(["DLOCK.RELEASE", resource, "node-worker"]), 1);
  assert.equal(await client.sendCommand(["DLOCK.INFO", resource]), null);
  await client.close();
}

(async () => {
  for (const protocol of [2, 3]) await lifecycle(protocol);
  console.log("node-redis: OK");
})().catch((error) => {
  console.error(error);
  process.exit(1);
});
