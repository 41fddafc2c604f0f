import { setTimeout as sleep } from "node:timers/promises";

import { Redis } from "ioredis";
import { Locks } from "@dlock/client";

const redis = new Redis(process.env["REDIS_URL"] ?? "redis://127.0.0.1:6379");
const locks = new Locks(redis);
{
  await using lease = await locks.hold("invoice:{42}", { ttl: 30_000, wait: 10_000 });
  // A write under the fence: a StaleError, nothing written, once a newer holder exists.
  await lease.fenced(["HSET", "invoice:{42}:data", "status", "paid"]);
  // Long work takes the signal: aborted with the LeaseLostError the moment the lease is lost.
  await sleep(100, undefined, { signal: lease.signal });
  console.log(`paid under fence ${lease.fence}`);
} // released here (a loss is thrown, never silent)

// Or a body under the lease: its result, or its own error; released when it settles.
const status = await locks.using("invoice:{42}", {}, (lease) => lease.fenced(["HGET", "invoice:{42}:data", "status"]));
console.log(`status: ${String(status)}`);

locks.close();
redis.disconnect();
