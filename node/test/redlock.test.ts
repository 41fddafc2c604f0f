// The code a node-redlock user writes (the package's README: `new Redlock([client], settings)`,
// acquire, extend, release, using with `signal.aborted` and `signal.error`), run against dlock
// through `@dlock/client/redlock` (the built package, as a user imports it), with ioredis and
// with node-redis. The loss reaches the signal whatever ends the lock: a DEL, a DLOCK.REVOKE.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { channelName, LeaseLostError, Locks, NotAcquiredError, type RedisLike } from "@dlock/client";
import Redlock, { type Lock } from "@dlock/client/redlock";
import { Server } from "./kit.js";

interface Client {
  redis: RedisLike;
  admin(...args: string[]): Promise<unknown>;
  close(): void;
}

const clients: Record<string, (server: Server) => Promise<Client>> = {
  ioredis: (server) => {
    const redis = server.ioredis();
    return Promise.resolve({
      redis,
      admin: (...args) => redis.call(args[0] ?? "", ...args.slice(1)),
      close: () => {
        redis.disconnect();
      },
    });
  },
  "node-redis": async (server) => {
    const redis = await server.nodeRedis();
    return {
      redis,
      admin: (...args) => redis.sendCommand(args),
      close: () => {
        if (redis.isOpen) redis.destroy();
      },
    };
  },
};

/** Resolves with the signal once it is aborted. */
const aborted = (signal: AbortSignal): Promise<AbortSignal> =>
  new Promise((resolve) => {
    if (signal.aborted) resolve(signal);
    else
      signal.addEventListener(
        "abort",
        () => {
          resolve(signal);
        },
        { once: true },
      );
  });

for (const [kind, make] of Object.entries(clients)) {
  describe(`Redlock on dlock, with ${kind}`, { timeout: 30_000 }, () => {
    let server: Server;
    let client: Client;
    let redlock: Redlock;
    let inspector: Locks;
    before(async () => {
      server = await Server.start();
      client = await make(server);
      inspector = new Locks(client.redis);
      redlock = new Redlock([client.redis], { retryCount: 10, retryDelay: 200, retryJitter: 200, driftFactor: 0.01 });
    });
    after(async () => {
      await redlock.quit();
      inspector.close();
      client.close();
      server.stop();
    });

    /** The resource's holder, by DLOCK.INFO. */
    const owner = async (resource: string): Promise<string | null> => (await inspector.info(resource))?.owner ?? null;

    test("acquire, extend and release, as node-redlock's README writes them", async () => {
      let lock: Lock = await redlock.acquire(["rl:a"], 5_000);
      assert.deepEqual(lock.resources, ["rl:a"]);
      assert.equal(await owner("rl:a"), lock.value);
      assert.ok(lock.fence > 0);
      const expiration = lock.expiration;
      assert.ok(expiration > Date.now() && expiration <= Date.now() + 5_000);
      // Held: another acquire with no retries is refused at once; with 3 × 100 ms, after 0.3 s in line.
      let started = performance.now();
      await assert.rejects(redlock.acquire(["rl:a"], 5_000, { retryCount: 0 }), NotAcquiredError);
      assert.ok(performance.now() - started < 250, `refused after ${String(performance.now() - started)} ms`);
      started = performance.now();
      await assert.rejects(redlock.acquire(["rl:a"], 5_000, { retryCount: 3, retryDelay: 100 }), NotAcquiredError);
      const waited = performance.now() - started;
      assert.ok(waited >= 290 && waited < 800, `refused after ${String(waited)} ms`);
      lock = await lock.extend(5_000);
      assert.ok(lock.expiration >= expiration);
      lock = await redlock.extend(lock, 5_000);
      await lock.release();
      assert.equal(await owner("rl:a"), null);
      const next = await redlock.acquire(["rl:a"], 5_000);
      assert.ok(next.fence > lock.fence);
      await redlock.release(next);
      // A lock on several resources, or a second client: one server decides, one resource.
      await assert.rejects(redlock.acquire(["rl:a", "rl:b"], 5_000), /exactly one resource/);
      assert.throws(() => new Redlock([client.redis, client.redis]), /exactly one client/);
    });

    test("using returns the routine's result and releases the lock", async () => {
      const result = await redlock.using(["rl:u"], 5_000, async (signal) => {
        assert.equal(signal.aborted, false);
        assert.notEqual(await owner("rl:u"), null);
        return "done";
      });
      assert.equal(result, "done");
      assert.equal(await owner("rl:u"), null);
    });

    test("using: an operator's DEL aborts the routine's signal with the loss (signal.error), and using throws it", async () => {
      let seen: { aborted: boolean; error: unknown } | null = null;
      await assert.rejects(
        redlock.using(["rl:d"], 900, async (signal) => {
          await client.admin("DEL", "rl:d");
          await aborted(signal); // the next renewal (ttl/3) is refused
          seen = { aborted: signal.aborted, error: signal.error };
          return "finished anyway";
        }),
        (error) => error instanceof LeaseLostError && error.reason === "renewal_refused",
      );
      const { aborted: wasAborted, error } = seen as unknown as { aborted: boolean; error: unknown };
      assert.equal(wasAborted, true);
      assert.ok(error instanceof LeaseLostError && error.reason === "renewal_refused");
    });

    test("using with settings: DLOCK.REVOKE aborts the routine's signal at once (revoked, with the reason)", async () => {
      const started = performance.now();
      let heard = 0;
      const own = new Error("stopped: the lock was revoked");
      await assert.rejects(
        redlock.using(["rl:r"], 30_000, { retryCount: 0 }, async (signal) => {
          // The lock listens on its channel without delaying the grant: a REVOKE before the
          // subscription is made would end the lease unheard (and the next ones find no lease).
          while (Number(((await client.admin("PUBSUB", "NUMSUB", channelName("rl:r"))) as unknown[])[1]) === 0) {
            assert.ok(performance.now() - started < 2_000, "the lock never listened on its channel");
            await new Promise((resolve) => setTimeout(resolve, 5));
          }
          while (!signal.aborted) {
            await client.admin("DLOCK.REVOKE", "rl:r", "REASON", "stuck");
            await Promise.race([aborted(signal), new Promise((resolve) => setTimeout(resolve, 50))]);
          }
          heard = performance.now() - started;
          assert.ok(signal.error instanceof LeaseLostError);
          assert.equal(signal.error.reason, "revoked");
          assert.equal(signal.error.detail, "stuck");
          throw own; // what a node-redlock routine does: `if (signal.aborted) throw signal.error` or its own
        }),
        (error) => error === own,
      );
      // Long before the first renewal (10 s) could have told.
      assert.ok(heard < 2_000, `heard after ${String(heard)} ms`);
      assert.equal(await owner("rl:r"), null);
    });

    test("a failing client: the lock's failed renewals are emitted as redlock's `error`", async () => {
      const own = await make(server);
      const failing = new Redlock([own.redis]);
      const errors: unknown[] = [];
      failing.on("error", (error: unknown) => errors.push(error));
      try {
        const lock = await failing.acquire(["rl:e"], 600);
        own.close();
        await aborted(lock.lease.signal);
        assert.ok(errors.length >= 1, "no error emitted");
        await assert.rejects(lock.release(), (error) => error instanceof LeaseLostError && error.reason === "unreachable");
      } finally {
        await failing.quit();
      }
    });
  });
}
