// A three-primary Redis Cluster: hold, fenced and a hand-over, through ioredis's Cluster and
// node-redis's createCluster, each routed to the primary of the resource's slot.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { Locks, StaleError, ServerError } from "../src/index.js";
import { TestCluster } from "./kit.js";

let cluster: TestCluster;
before(async () => {
  cluster = await TestCluster.start();
});
after(() => {
  cluster.stop();
});

async function scenario(locks: Locks): Promise<void> {
  for (const resource of ["invoice:{1}", "invoice:{2}", "invoice:{3}", "orders:{eu}"]) {
    const lease = await locks.hold(resource, { ttl: 5_000 });
    assert.equal(await lease.fenced(["SET", `${resource}:data`, String(lease.fence)]), "OK");
    await assert.rejects(lease.fenced(["SET", "elsewhere", "x"]), (error) => error instanceof ServerError && error.class === "cross_slot");
    const waiting = locks.hold(resource, { ttl: 5_000, wait: 5_000 });
    await sleep(100);
    await lease.release();
    const next = await waiting;
    assert.ok(next.fence > lease.fence);
    await assert.rejects(lease.fenced(["SET", `${resource}:data`, "late"]), StaleError);
    await next.release();
  }
}

test("ioredis Cluster: hold, fenced, a hand-over, across the shards", async () => {
  const redis = cluster.ioredis();
  try {
    await scenario(new Locks(redis));
  } finally {
    redis.disconnect();
  }
});

test("node-redis createCluster: hold, fenced, a hand-over, across the shards", async () => {
  const redis = await cluster.nodeRedis();
  try {
    await scenario(new Locks(redis));
  } finally {
    redis.destroy();
  }
});
