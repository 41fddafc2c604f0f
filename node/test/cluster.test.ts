// A three-primary Redis Cluster: hold, fenced and a hand-over, through ioredis's Cluster and
// node-redis's createCluster, each routed to the primary of the resource's slot; tickets and
// observers subscribed (SSUBSCRIBE) on that primary, also through a Cluster still connecting.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { channelName, LeaseLostError, Locks, StaleError, ServerError, type Leader } from "../src/index.js";
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

// A holder listens on its resource's shard channel, on the slot's primary (SSUBSCRIBE): an
// operator's DLOCK.REVOKE there ends its lease at once, on every shard and through both clients.
test("Cluster: a revoked holder loses its lease at once (revoked), through ioredis and node-redis, on every shard", async () => {
  const operator = cluster.ioredis();
  const nodes = cluster.nodes.map((node) => node.ioredis());
  /** Subscribers of resource's shard channel, over the primaries (PUBSUB SHARDNUMSUB). */
  const listeners = async (resource: string): Promise<number> => {
    let count = 0;
    for (const node of nodes) count += Number(((await node.call("PUBSUB", "SHARDNUMSUB", channelName(resource))) as unknown[])[1]);
    return count;
  };
  const untilListeners = async (resource: string, count: number): Promise<void> => {
    const deadline = performance.now() + 3_000;
    while ((await listeners(resource)) !== count) {
      assert.ok(performance.now() < deadline, `${resource}: never ${String(count)} subscriber(s) on its shard channel`);
      await sleep(5);
    }
  };
  const ioredis = cluster.ioredis();
  const nodeRedis = await cluster.nodeRedis();
  try {
    for (const [kind, redis] of [["ioredis", ioredis], ["node-redis", nodeRedis]] as const) {
      const locks = new Locks(redis);
      try {
        // Slots 3300, 7365 and 15495: one on each primary.
        for (const resource of ["revoke:{b}", "revoke:{c}", "revoke:{a}"]) {
          const lease = await locks.hold(resource, { ttl: 30_000 });
          await untilListeners(resource, 1);
          const lost = new Promise<LeaseLostError>((resolve) => lease.once("lost", resolve));
          assert.equal(Number(await operator.call("DLOCK.REVOKE", resource, "REASON", `${kind} ${resource}`)), 1);
          const error = await lost;
          assert.equal(error.reason, "revoked", `${kind} ${resource}`);
          assert.equal(error.detail, `${kind} ${resource}`);
          assert.equal(lease.signal.reason, error);
          await assert.rejects(lease.release(), (thrown) => thrown === error);
          await untilListeners(resource, 0);
        }
      } finally {
        locks.close();
      }
    }
  } finally {
    for (const node of nodes) node.disconnect();
    operator.disconnect();
    ioredis.disconnect();
    nodeRedis.destroy();
  }
});

// A lease released and the next one held at once, on the same resource: the second's shard
// subscription must not be lost to the first's unsubscription still in flight (node-redis closes
// a shard's pub/sub client when its last channel goes; a subscription sent meanwhile went to the
// closing client, and a ticket behind the holder then waited for its refresh).
test("Cluster: back-to-back holds of one resource each end up subscribed to its shard channel, through both clients", async () => {
  const nodes = cluster.nodes.map((node) => node.ioredis());
  const listeners = async (resource: string): Promise<number> => {
    let count = 0;
    for (const node of nodes) count += Number(((await node.call("PUBSUB", "SHARDNUMSUB", channelName(resource))) as unknown[])[1]);
    return count;
  };
  const ioredis = cluster.ioredis();
  const nodeRedis = await cluster.nodeRedis();
  try {
    for (const [name, redis] of [["ioredis", ioredis], ["node-redis", nodeRedis]] as const) {
      const locks = new Locks(redis);
      const resource = `again:{${name}}`;
      try {
        for (let round = 0; round < 20; round++) {
          const first = await locks.hold(resource, { ttl: 5_000 });
          await first.release();
          const second = await locks.hold(resource, { ttl: 5_000 });
          const deadline = performance.now() + 2_000;
          while ((await listeners(resource)) !== 1) {
            assert.ok(performance.now() < deadline, `${name}, round ${String(round)}: the holder's channel is not subscribed`);
            await sleep(5);
          }
          await second.release();
        }
      } finally {
        locks.close();
      }
    }
  } finally {
    ioredis.disconnect();
    nodeRedis.destroy();
    for (const node of nodes) node.disconnect();
  }
});

// A set's commands name numkeys first: each goes straight to the primary of the set's slot (not
// through a MOVED), on every shard and through both clients; a waiting set listens on its
// members' shard channels there, and is granted on the release.
test("Cluster: a set is granted, waits and is released on its slot's primary, through ioredis and node-redis", async () => {
  const nodes = cluster.nodes.map((node) => node.ioredis());
  /** How many DLOCK.ACQUIREALL each primary saw, run or redirected. */
  const seen = async (): Promise<number[]> =>
    Promise.all(
      nodes.map(async (node) => {
        const stats = String(await node.call("INFO", "commandstats"));
        const line = /cmdstat_dlock\.acquireall:calls=(\d+).*?rejected_calls=(\d+)/.exec(stats);
        return line === null ? 0 : Number(line[1]) + Number(line[2]);
      }),
    );
  const ioredis = cluster.ioredis();
  const nodeRedis = await cluster.nodeRedis();
  try {
    for (const [kind, redis] of [["ioredis", ioredis], ["node-redis", nodeRedis]] as const) {
      const locks = new Locks(redis);
      try {
        // Slots 3300, 7365 and 15495: one on each primary.
        for (const tag of ["b", "c", "a"]) {
          const set = [`order:{${tag}}:items`, `order:{${tag}}:payment`];
          for (const node of nodes) await node.call("CONFIG", "RESETSTAT");
          const held = await locks.hold(set[1] ?? "", { ttl: 5_000 });
          const waiting = locks.holdAll(set, { ttl: 5_000, wait: 5_000 });
          await sleep(100);
          const released = performance.now();
          await held.release();
          const lease = await waiting;
          // Woken on a member's shard channel, not by the ticket's refresh (every 1.7 s).
          assert.ok(performance.now() - released < 1_000, `${kind} ${tag}: took ${String(performance.now() - released)} ms`);
          assert.ok((lease.fences[1] ?? 0) > held.fence);
          assert.equal(await lease.fenced(set[0] ?? "", ["SET", `order:{${tag}}:data`, kind]), "OK");
          await lease.release();
          assert.equal((await locks.info(set[0] ?? ""))?.owner ?? null, null);
          const counts = await seen();
          assert.equal(counts.filter((count) => count > 0).length, 1, `${kind} ${tag}: ACQUIREALL seen by ${JSON.stringify(counts)}`);
        }
        // Members of two slots: the server refuses the set, nothing is taken.
        await assert.rejects(
          locks.holdAll(["split:{a}", "split:{b}"], { ttl: 5_000, wait: 0 }),
          (error) => error instanceof ServerError && error.class === "cross_slot",
        );
        assert.equal((await locks.info("split:{a}"))?.owner ?? null, null);
      } finally {
        locks.close();
      }
    }
  } finally {
    for (const node of nodes) node.disconnect();
    ioredis.disconnect();
    nodeRedis.destroy();
  }
});
