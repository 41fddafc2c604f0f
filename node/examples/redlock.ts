import { Redis } from "ioredis";
// Before: import Redlock from "redlock";
import Redlock from "@dlock/client/redlock";

const redis = new Redis(process.env["REDIS_URL"] ?? "redis://127.0.0.1:6379");
// Before: new Redlock([redisA, redisB, redisC], { … }): one client here, one server decides.
const redlock = new Redlock([redis], { retryCount: 10, retryDelay: 200 });

let lock = await redlock.acquire(["report"], 5_000);
try {
  // New: the fence, for the writes the lock protects.
  await redis.call("DLOCK.FENCED", "report", String(lock.fence), "SET", "report:owner", "me");
  lock = await lock.extend(5_000);
} finally {
  await lock.release();
}

const send = (batch: string[]): Promise<number> => Promise.resolve(batch.length); // your mailer
const sent = await redlock.using(["mail"], 5_000, async (signal) => {
  let count = 0;
  for (const batch of [["a@example.com"], ["b@example.com"]]) {
    // Aborted the moment the lock is lost, for any reason, not only a failed extension.
    if (signal.aborted) throw signal.error ?? new Error("lock lost");
    count += await send(batch);
  }
  return count;
});
console.log(`fence ${lock.fence}, sent ${sent}`);

await redlock.quit();
redis.disconnect();
