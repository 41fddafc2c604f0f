// DLOCK.FENCED is sent at most once: on a connection of dlock's own that never sends a command
// again, not on the caller's client (ioredis sends an unanswered command again after a reconnect
// and, like node-redis, sends what it queued while disconnected once connected again). Each
// client with its default settings, through a proxy that breaks its links.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { Redis } from "ioredis";
import { createClient } from "redis";

import { channelName, Locks, type RedisLike } from "../src/index.js";
import { Proxy, Server } from "./kit.js";

/** The caller's client, with its defaults, connected to port. */
const clients: Record<string, (port: number) => Promise<{ redis: RedisLike; close(): void }>> = {
  ioredis: (port) => {
    const redis = new Redis({ host: "127.0.0.1", port });
    redis.on("error", () => undefined);
    return Promise.resolve({
      redis,
      close: () => {
        redis.disconnect();
      },
    });
  },
  "node-redis": async (port) => {
    const redis = createClient({ socket: { host: "127.0.0.1", port } });
    redis.on("error", () => undefined);
    await redis.connect();
    return {
      redis,
      close: () => {
        if (redis.isOpen) redis.destroy();
      },
    };
  },
};

for (const [kind, connectTo] of Object.entries(clients)) {
  describe(`fenced writes at most once, with ${kind}`, { timeout: 30_000 }, () => {
    let server: Server;
    let proxy: Proxy;
    let admin: Redis;
    before(async () => {
      server = await Server.start();
      proxy = await Proxy.start(server.port);
      admin = server.ioredis();
    });
    after(() => {
      admin.disconnect();
      proxy.stop();
      server.stop();
    });

    test("a fenced write whose reply is lost ran once and is not sent again", async () => {
      const client = await connectTo(proxy.port);
      const locks = new Locks(client.redis, { requestTimeout: 1000 });
      try {
        const lease = await locks.hold("{w1}", { ttl: 30_000 });
        assert.equal(await lease.fenced(["SET", "{w1}:n", "0"]), "OK");
        // The holder's subscription to its channel (for a revocation) is confirmed first: the
        // reply the proxy drops must be the write's, not the subscription's.
        const deadline = performance.now() + 5_000;
        while (Number(((await admin.call("PUBSUB", "NUMSUB", channelName("{w1}"))) as unknown[])[1]) < 1) {
          assert.ok(performance.now() < deadline, "the holder never subscribed to its channel");
          await sleep(10);
        }
        proxy.dropNextReply();
        // The INCR ran, its reply never came: the outcome is unknown to the caller.
        await assert.rejects(lease.fenced(["INCR", "{w1}:n"]));
        await sleep(500); // time for a reconnect and a re-send
        assert.equal(await admin.get("{w1}:n"), "1");
        // The next write goes on a new connection.
        assert.equal(await lease.fenced(["INCR", "{w1}:n"]), 2);
        await lease.release();
      } finally {
        locks.close();
        client.close();
      }
    });

    test("a fenced write sent while the links are down is not queued to run once they are back", async () => {
      const client = await connectTo(proxy.port);
      const locks = new Locks(client.redis, { requestTimeout: 1000 });
      try {
        const lease = await locks.hold("{w2}", { ttl: 30_000 });
        assert.equal(await lease.fenced(["SET", "{w2}:n", "0"]), "OK");
        proxy.cut();
        await sleep(50); // the caller's client knows its link is down, and reconnects
        await assert.rejects(lease.fenced(["INCR", "{w2}:n"]));
        await proxy.heal();
        // The caller's client reconnects (its own retries), and would send what it queued.
        const deadline = performance.now() + 10_000;
        while ((await locks.info("{w2}").catch(() => null)) === null) {
          assert.ok(performance.now() < deadline, "the caller's client did not reconnect");
          await sleep(50);
        }
        await sleep(200);
        assert.equal(await admin.get("{w2}:n"), "0");
        assert.equal(await lease.fenced(["INCR", "{w2}:n"]), 1);
        await lease.release();
      } finally {
        locks.close();
        client.close();
      }
    });

    test("a fenced write held by a paused server and cut by CLIENT KILL never runs later", async () => {
      const client = await connectTo(server.port);
      const locks = new Locks(client.redis, { requestTimeout: 1000 });
      try {
        const lease = await locks.hold("{w3}", { ttl: 30_000 });
        assert.equal(await lease.fenced(["SET", "{w3}:n", "0"]), "OK");
        await admin.call("CLIENT", "PAUSE", "10000", "WRITE");
        try {
          // Its rejection is awaited from now on: the kill below may close the link before its
          // own reply comes (the rejection must never be unhandled meanwhile).
          const write = assert.rejects(lease.fenced(["INCR", "{w3}:n"]));
          await sleep(200);
          assert.equal(await admin.get("{w3}:n"), "0");
          await admin.call("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes");
          await write;
        } finally {
          await admin.call("CLIENT", "UNPAUSE");
        }
        await sleep(500);
        assert.equal(await admin.get("{w3}:n"), "0");
        await lease.release();
      } finally {
        locks.close();
        client.close();
      }
    });
  });
}
