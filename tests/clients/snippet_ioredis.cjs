// Acquire, write under the fence, release, from ioredis (tested with ioredis 6.1.0).
const Redis = require("ioredis");
const { randomUUID } = require("node:crypto");

async function main(port) {
  // Re-send nothing after a reconnect: a DLOCK.FENCED sent again could run its write twice.
  const client = new Redis({ port, autoResendUnfulfilledCommands: false });
  // WAIT blocks its connection: send it on a connection of its own, whose commandTimeout (if you
  // set one) outlasts the 5 s wait.
  const waiter = client.duplicate({ commandTimeout: 10000 });
  const token = randomUUID(); // made before the first send; a retried ACQUIRE sends the same token
  let fence;
  try {
    // CLAIM: a lease handed over to a client that gave up (and never claims it) lapses in 10 s.
    fence = await waiter.call("DLOCK.ACQUIRE", "invoice:{123}", token, "30000", "WAIT", "5000", "CLAIM", "10000");
  } catch (error) {
    // Failed on this side: the lease may have been handed over as it failed. Close that
    // connection, then release the token (this attempt's alone) from the other one.
    waiter.disconnect();
    await client.call("DLOCK.RELEASE", "invoice:{123}", token);
    throw error;
  }
  await waiter.quit();
  if (fence === null) {
    console.log("invoice:{123} is held by someone else; try again later");
    return client.quit();
  }
  // Claim it: the same ACQUIRE again answers the same fence and starts the full ttl.
  await client.call("DLOCK.ACQUIRE", "invoice:{123}", token, "30000");
  try {
    await client.call("DLOCK.FENCED", "invoice:{123}", String(fence), "HSET", "invoice:{123}:data", "status", "paid");
    console.log(`paid under fence ${fence}`);
  } catch (error) {
    if (!error.message.startsWith("STALE")) throw error;
    console.log("the lease ended before the write; nothing was written");
  } finally {
    await client.call("DLOCK.RELEASE", "invoice:{123}", token); // 0 if the lease had ended
    await client.quit();
  }
}

main(Number(process.argv[2] ?? 6379)).catch((error) => {
  console.error(error);
  process.exit(1);
});
