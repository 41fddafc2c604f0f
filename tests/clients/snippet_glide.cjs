// Acquire, write under the fence, release, from valkey-glide (Node, tested with 2.5.2).
const { GlideClient } = require("@valkey/valkey-glide");
const { randomUUID } = require("node:crypto");

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function main(port) {
  // Glide multiplexes one connection and gives up on a reply after 250 ms (requestTimeout): a
  // WAIT would outlast that and hold up every other request. Take a QUEUE ticket instead.
  const client = await GlideClient.createClient({ addresses: [{ host: "127.0.0.1", port }] });
  const token = randomUUID(); // made before the first send; every ACQUIRE sends the same token
  const acquire = () =>
    // Nil at once until the ticket's turn (the ticket stands 2 s after each ACQUIRE), then the
    // fence. CLAIM: a turn nobody asks for again lapses in 2 s.
    client.customCommand(["DLOCK.ACQUIRE", "invoice:{123}", token, "30000", "QUEUE", "2000", "CLAIM", "2000"]);
  let fence;
  try {
    const deadline = Date.now() + 5000;
    // Ask again well within the 2 s (or on a message on the channel dlock:key:invoice:{123}).
    while ((fence = await acquire()) === null && Date.now() < deadline) await sleep(200);
  } catch (error) {
    // Failed on this side (a timeout): the turn may have come; release the token.
    await client.customCommand(["DLOCK.RELEASE", "invoice:{123}", token]);
    throw error;
  }
  if (fence === null) {
    // The ticket leaves the line 2 s after the last ACQUIRE; a turn that comes first lapses.
    console.log("invoice:{123} is held by someone else; try again later");
    return client.close();
  }
  // The ACQUIRE that answered the fence claimed the grant: the full ttl runs from now.
  try {
    await client.customCommand(["DLOCK.FENCED", "invoice:{123}", String(fence), "HSET", "invoice:{123}:data", "status", "paid"]);
    console.log(`paid under fence ${fence}`);
  } catch (error) {
    if (!error.message.startsWith("STALE")) throw error;
    console.log("the lease ended before the write; nothing was written");
  } finally {
    await client.customCommand(["DLOCK.RELEASE", "invoice:{123}", token]); // 0 if the lease had ended
    client.close();
  }
}

main(Number(process.argv[2] ?? 6379)).catch((error) => {
  console.error(error);
  process.exit(1);
});
