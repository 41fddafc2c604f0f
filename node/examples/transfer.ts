import { Redis } from "ioredis";
import { Locks } from "@dlock/client";

const redis = new Redis(process.env["REDIS_URL"] ?? "redis://127.0.0.1:6379");
const locks = new Locks(redis);
// Both accounts or neither, in any order: one hash tag, so one slot in a cluster.
const accounts = ["{acct}:alice", "{acct}:bob"];
await locks.usingAll(accounts, {}, (set) => set.fenced("{acct}:alice", ["SET", "{acct}:alice:balance", "100"]));
{
  await using set = await locks.holdAll(accounts, { ttl: 30_000, wait: 10_000 });
  // Each write under its own account's fence: a StaleError, nothing written, once it is lost.
  await set.fenced("{acct}:alice", ["DECRBY", "{acct}:alice:balance", "30"]);
  await set.fenced("{acct}:bob", ["INCRBY", "{acct}:bob:balance", "30"]);
  console.log(`moved 30 under fences ${set.fences.join(", ")}`);
} // both released here (the loss of either is the loss of the set, thrown)

const balances = await locks.usingAll(accounts, {}, (set) =>
  Promise.all(accounts.map((account) => set.fenced(account, ["GET", `${account}:balance`]))),
);
console.log(`balances: ${balances.join(", ")}`);

locks.close();
redis.disconnect();
