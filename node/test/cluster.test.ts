// A three-primary Redis Cluster: hold, fenced and a hand-over, through ioredis's Cluster and
// node-redis's createCluster, each routed to the primary of the resource's slot; tickets and
// observers subscribed (SSUBSCRIBE) on that primary, also through a Cluster still connecting.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { Locks, StaleError, ServerError, type Leader } from "../src/index.js";
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
    // A ticket, woken on the primary's shard channel (not by its refresh every second).
    const ticket = locks.hold(resource, { ttl: 5_000, wait: 5_000, strategy: "tickets", ticket: 3_000 });
    await sleep(200);
    assert.equal((await locks.info(resource))?.tickets, 1);
    const released = performance.now();
    await next.release();
    const third = await ticket;
    assert.ok(performance.now() - released < 500, `${resource}: took ${String(performance.now() - released)} ms`);
    assert.ok(third.fence > next.fence);
    await third.release();
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

// An ioredis Cluster learns its slot map after it is made (it connects in the background): a
// ticket or an observer started at once must wait for it, not fail on an unknown primary.
test("ioredis Cluster still connecting: a ticket is queued on the resource's primary and handed over", async () => {
  const holderClient = cluster.ioredis();
  const holderLocks = new Locks(holderClient);
  try {
    const holder = await holderLocks.hold("ticket:{fresh}", { ttl: 5_000 });
    const fresh = cluster.ioredis();
    const freshLocks = new Locks(fresh);
    try {
      // Nothing awaited between the Cluster's creation and the ticket.
      const waiting = freshLocks.hold("ticket:{fresh}", { ttl: 5_000, wait: 5_000, strategy: "tickets", ticket: 3_000 });
      const deadline = performance.now() + 3_000;
      while ((await holderLocks.info("ticket:{fresh}"))?.tickets !== 1) {
        assert.ok(performance.now() < deadline, "the ticket was never queued");
        await sleep(20);
      }
      await sleep(100);
      const released = performance.now();
      await holder.release();
      const next = await waiting;
      // Woken by the hand-over on the primary's shard channel, not by the ticket's refresh (1 s).
      assert.ok(performance.now() - released < 500, `took ${String(performance.now() - released)} ms`);
      assert.ok(next.fence > holder.fence);
      assert.equal((await holderLocks.info("ticket:{fresh}"))?.owner, next.token);
      await next.release();
    } finally {
      freshLocks.close();
      fresh.disconnect();
    }
    // The same for an observer: its first leader comes from a Cluster made a moment ago.
    const leader = await holderLocks.campaign("election:{fresh}", "10.0.0.1:80", { ttl: 5_000 });
    const observed = cluster.ioredis();
    const observing = new Locks(observed);
    const controller = new AbortController();
    try {
      const seen: (Leader | null)[] = [];
      for await (const now of observing.observe("election:{fresh}", { signal: controller.signal })) {
        seen.push(now);
        break;
      }
      assert.equal(seen[0]?.address, "10.0.0.1:80");
    } finally {
      controller.abort();
      observing.close();
      observed.disconnect();
      await leader.release();
    }
  } finally {
    holderLocks.close();
    holderClient.disconnect();
  }
});
