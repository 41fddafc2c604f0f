// What the caller's client settings do to a wait. dlock's WAIT goes on a connection of its own
// whose timeouts are above the wait: with the clients' defaults, and with a command timeout and
// a socket timeout far below the wait, it is sent once and neither cut nor sent again (the
// server counts the waits it started and abandoned). The same WAIT sent on the caller's client
// with those settings is cut, and by ioredis sent again: the numbers in docs/clients.md.

import assert from "node:assert/strict";
import { after, before, describe, test, type TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { Redis } from "ioredis";
import { createClient } from "redis";

import { Locks, type RedisLike } from "../src/index.js";
import { Server } from "./kit.js";

const WAIT = 4_000;
const HELD_FOR = 2_500;
const SHORT = 1_000;

interface Caller {
  redis: RedisLike;
  raw(args: string[]): Promise<unknown>;
  close(): void;
}

const callers: Record<string, (server: Server) => Promise<Caller>> = {
  "ioredis defaults": (server) => Promise.resolve(ioredisCaller(server, {})),
  "ioredis commandTimeout and socketTimeout 1 s": (server) =>
    Promise.resolve(ioredisCaller(server, { commandTimeout: SHORT, socketTimeout: SHORT })),
  "node-redis defaults": (server) => nodeRedisCaller(server, {}),
  "node-redis command timeout 1 s": (server) => nodeRedisCaller(server, { commandOptions: { timeout: SHORT } }),
};

function ioredisCaller(server: Server, options: object): Caller {
  const redis = server.ioredis(options);
  redis.on("error", () => undefined);
  return {
    redis,
    raw: (args) => redis.call(args[0] ?? "", ...args.slice(1)),
    close: () => {
      redis.disconnect();
    },
  };
}

async function nodeRedisCaller(server: Server, options: { socket?: object; commandOptions?: object }): Promise<Caller> {
  const redis = createClient({ ...options, socket: { host: "127.0.0.1", port: server.port, ...(options.socket ?? {}) } });
  redis.on("error", () => undefined);
  await redis.connect();
  return {
    redis,
    raw: (args) => redis.sendCommand(args),
    close: () => {
      if (redis.isOpen) redis.destroy();
    },
  };
}

/** INFO dlock's wait counters. */
async function waits(admin: Redis): Promise<{ started: number; abandoned: number; granted: number }> {
  const info = await admin.info("dlock");
  const field = (name: string): number => Number(new RegExp(`^dlock_${name}:(\\d+)`, "m").exec(info)?.[1] ?? "NaN");
  return { started: field("waits_started"), abandoned: field("waits_abandoned"), granted: field("waits_granted") };
}

describe("the caller's client settings and a wait", { timeout: 120_000 }, () => {
  let server: Server;
  let admin: Redis;
  before(async () => {
    server = await Server.start();
    admin = server.ioredis();
  });
  after(() => {
    admin.disconnect();
    server.stop();
  });

  let n = 0;
  for (const [name, make] of Object.entries(callers)) {
    test(`${name}: dlock's ${String(WAIT)} ms wait is sent once, never cut, and granted at the release`, async (t: TestContext) => {
      const resource = `ws${String(++n)}`;
      const caller = await make(server);
      const locks = new Locks(caller.redis, { requestTimeout: 500 });
      try {
        assert.notEqual(await admin.call("DLOCK.ACQUIRE", resource, "holder", "10000"), null);
        const before = await waits(admin);
        const started = performance.now();
        const waiting = locks.hold(resource, { ttl: 5_000, wait: WAIT });
        await sleep(HELD_FOR);
        const released = performance.now();
        assert.equal(await admin.call("DLOCK.RELEASE", resource, "holder"), 1);
        const lease = await waiting;
        const granted = performance.now();
        const after = await waits(admin);
        t.diagnostic(`granted ${(granted - released).toFixed(0)} ms after the release, ${(granted - started).toFixed(0)} ms after the call; waits started ${String(after.started - before.started)}, abandoned ${String(after.abandoned - before.abandoned)}`);
        assert.equal(after.started - before.started, 1, "one WAIT");
        assert.equal(after.abandoned - before.abandoned, 0, "never cut");
        assert.equal(after.granted - before.granted, 1);
        assert.ok(granted - released < 300, `granted ${String(granted - released)} ms after the release`);
        await lease.release();
      } finally {
        locks.close();
        caller.close();
      }
    });
  }

  test("the same WAIT on the caller's ioredis with a 1 s command timeout: rejected at 1 s, the server still waits", async (t: TestContext) => {
    const caller = ioredisCaller(server, { commandTimeout: SHORT });
    try {
      assert.notEqual(await admin.call("DLOCK.ACQUIRE", "raw1", "holder", "10000"), null);
      const started = performance.now();
      await assert.rejects(caller.raw(["DLOCK.ACQUIRE", "raw1", "waiter", "5000", "WAIT", String(WAIT)]), /timed out/i);
      const rejected = performance.now() - started;
      const info = await admin.call("DLOCK.INFO", "raw1");
      t.diagnostic(`rejected after ${rejected.toFixed(0)} ms; DLOCK.INFO then: ${JSON.stringify(info)}`);
      assert.ok(rejected >= SHORT - 50 && rejected < SHORT + 500);
      // The server still holds the waiter's place: it would hand it the lease, unclaimed.
      assert.ok(JSON.stringify(info).includes('"waiters",1'), JSON.stringify(info));
      await admin.call("DLOCK.RELEASE", "raw1", "holder");
    } finally {
      caller.close();
    }
  });

  test("the same WAIT on the caller's ioredis with a 1 s socket timeout: the link is closed at 1 s and the WAIT sent again", async (t: TestContext) => {
    const caller = ioredisCaller(server, { socketTimeout: SHORT });
    try {
      assert.notEqual(await admin.call("DLOCK.ACQUIRE", "raw2", "holder", "10000"), null);
      const before = await waits(admin);
      const started = performance.now();
      const reply = caller.raw(["DLOCK.ACQUIRE", "raw2", "waiter", "5000", "WAIT", String(WAIT)]).then(
        (value) => ({ value, at: performance.now() - started }),
        (error: unknown) => ({ value: error, at: performance.now() - started }),
      );
      await sleep(SHORT + 700);
      const meanwhile = await waits(admin);
      await admin.call("DLOCK.RELEASE", "raw2", "holder");
      const outcome = await reply;
      const after = await waits(admin);
      t.diagnostic(
        `after ${String(SHORT + 700)} ms: waits started ${String(meanwhile.started - before.started)}, abandoned ${String(meanwhile.abandoned - before.abandoned)}; the call ended after ${outcome.at.toFixed(0)} ms with ${String(outcome.value)}; waits started in all ${String(after.started - before.started)}`,
      );
      assert.ok(meanwhile.abandoned - before.abandoned >= 1, "the first WAIT was abandoned with its link");
      assert.ok(meanwhile.started - before.started >= 2, "and sent again after the reconnect");
      await admin.call("DLOCK.RELEASE", "raw2", "waiter");
    } finally {
      caller.close();
    }
  });

  test("a node-redis client with a 1 s socket timeout, idle for longer, is closed for good", async () => {
    const caller = await nodeRedisCaller(server, { socket: { socketTimeout: SHORT } });
    try {
      assert.equal(await caller.raw(["PING"]), "PONG");
      await sleep(SHORT + 500);
      await assert.rejects(caller.raw(["PING"]), (error) => error instanceof Error && error.constructor.name === "ClientClosedError");
    } finally {
      caller.close();
    }
  });

  test("the same WAIT on the caller's node-redis with a 1 s socket timeout: rejected at 1 s, the server drops the waiter", async (t: TestContext) => {
    const caller = await nodeRedisCaller(server, { socket: { socketTimeout: SHORT } });
    try {
      assert.notEqual(await admin.call("DLOCK.ACQUIRE", "raw3", "holder", "10000"), null);
      const before = await waits(admin);
      const started = performance.now();
      await assert.rejects(caller.raw(["DLOCK.ACQUIRE", "raw3", "waiter", "5000", "WAIT", String(WAIT)]));
      const rejected = performance.now() - started;
      await sleep(700);
      const after = await waits(admin);
      t.diagnostic(`rejected after ${rejected.toFixed(0)} ms; waits started ${String(after.started - before.started)}, abandoned ${String(after.abandoned - before.abandoned)}`);
      assert.ok(rejected >= SHORT - 50 && rejected < SHORT + 500);
      assert.equal(after.started - before.started, 1, "not sent again");
      assert.equal(after.abandoned - before.abandoned, 1);
      await admin.call("DLOCK.RELEASE", "raw3", "holder");
    } finally {
      caller.close();
    }
  });
});
