// Acquire, write under the fence, release, from node-redis (tested with node-redis 6.3.1).
const { createClient } = require("redis");
const { randomUUID } = require("node:crypto");

async function main(url) {
  const client = createClient({ url });
  client.on("error", (error) => console.error("redis:", error.message));
  await client.connect();
  // WAIT blocks its connection: send it on a connection of its own.
  const waiter = client.duplicate();
  await waiter.connect();
  const token = randomUUID(); // made before the first send; a retried ACQUIRE sends the same token
  let fence;
  try {
    // CLAIM: a lease handed over to a client that gave up (and never claims it) lapses in 10 s.
    fence = await waiter.sendCommand(["DLOCK.ACQUIRE", "invoice:{123}", token, "30000", "WAIT", "5000", "CLAIM", "10000"]);
  } catch (error) {
    // Failed on this side: the lease may have been handed over as it failed. Close that
    // connection, then release the token (this attempt's alone) from the other one.
    waiter.destroy();
    await client.sendCommand(["DLOCK.RELEASE", "invoice:{123}", token]);
    throw error;
  }
  await waiter.close();
  if (fence === null) {
    console.log("invoice:{123} is held by someone else; try again later");
    return client.close();
  }
  // Claim it: the same ACQUIRE again answers the same fence and starts the full ttl.
  await client.sendCommand(["DLOCK.ACQUIRE", "invoice:{123}", token, "30000"]);
  try {
    await client.sendCommand(["DLOCK.FENCED", "invoice:{123}", String(fence), "HSET", "invoice:{123}:data", "status", "paid"]);
    console.log(`paid under fence ${fence}`);
  } catch (error) {
    if (!error.message.startsWith("STALE")) throw error;
    console.log("the lease ended before the write; nothing was written");
  } finally {
    await client.sendCommand(["DLOCK.RELEASE", "invoice:{123}", token]); // 0 if the lease had ended
    await client.close();
  }
}

main(`redis://127.0.0.1:${process.argv[2] ?? 6379}`).catch((error) => {
  console.error(error);
  process.exit(1);
});
