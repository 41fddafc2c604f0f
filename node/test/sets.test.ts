// Sets of resources (locks.holdAll, usingAll: DLOCK.ACQUIREALL, RENEWALL, RELEASEALL) against a
// real server, through ioredis and through node-redis: granted whole or not at all, waiting in
// every member's line, renewed, lost and released whole, counted and logged as one lease.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { Redis } from "ioredis";

import {
  channelName,
  InvalidArgumentError,
  LeaseLostError,
  Locks,
  MAX_SET,
  NotAcquiredError,
  SetLease,
  StaleError,
  type RedisLike,
} from "../src/index.js";
import { acquireAllArgs, fencesOf, releaseAllArgs, renewAllArgs } from "../src/protocol.js";
import { Server } from "./kit.js";

const SET = ["{acct}:alice", "{acct}:bob"] as const;
const [ALICE, BOB] = SET;

/** promise's value, or a failure naming what did not happen within ms. */
async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      reject(new assert.AssertionError({ message: `not within ${String(ms)} ms: ${what}` }));
    }, ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** Holds the event loop for ms: nothing else runs meanwhile (timers, sockets, renewals). */
function block(ms: number): void {
  const end = performance.now() + ms;
  while (performance.now() < end) {
    // busy: a blocked event loop
  }
}

test("the commands of sets name every member in order, then the token", () => {
  assert.deepEqual(acquireAllArgs({ resources: SET, token: "t", ttlMs: 30_000 }), ["DLOCK.ACQUIREALL", "2", ALICE, BOB, "t", "30000"]);
  assert.deepEqual(acquireAllArgs({ resources: SET, token: "t", ttlMs: 30_000, queueMs: 8_000, meta: "m" }).slice(-4), [
    "QUEUE",
    "8000",
    "META",
    "m",
  ]);
  assert.deepEqual(renewAllArgs(SET, "t", 30_000, [11, 12]), ["DLOCK.RENEWALL", "2", ALICE, BOB, "t", "30000", "FENCES", "11", "12"]);
  assert.deepEqual(releaseAllArgs(SET, "t", [11, 12]), ["DLOCK.RELEASEALL", "2", ALICE, BOB, "t", "FENCES", "11", "12"]);
  assert.deepEqual(releaseAllArgs(SET, "t"), ["DLOCK.RELEASEALL", "2", ALICE, BOB, "t"]);
  assert.deepEqual(fencesOf([11, 12], 2), [11, 12]);
  assert.equal(fencesOf(null, 2), null);
  assert.throws(() => fencesOf([11], 2), TypeError);
});

test("a set the server would refuse is refused before anything is sent", async () => {
  // Nothing listens there, and nothing may be sent: not even a connection is opened.
  const redis = new Redis({ port: 1, lazyConnect: true });
  let attempts = 0;
  const locks = new Locks(redis, { metrics: { acquireAttempt: () => attempts++ } });
  try {
    await assert.rejects(locks.holdAll(["a", "b", "a"]), (error) => error instanceof InvalidArgumentError && /appears twice/.test(error.message));
    await assert.rejects(locks.holdAll([]), (error) => error instanceof InvalidArgumentError && /1 to 64/.test(error.message));
    const many = Array.from({ length: MAX_SET + 1 }, (_, i) => `k${String(i)}`);
    await assert.rejects(locks.holdAll(many), (error) => error instanceof InvalidArgumentError && /1 to 64/.test(error.message));
    await assert.rejects(locks.holdAll("ab" as unknown as string[]), (error) => error instanceof InvalidArgumentError && /array/.test(error.message));
    await assert.rejects(locks.holdAll(["a"], { ttl: 0 }), InvalidArgumentError);
    assert.equal(attempts, 0);
    assert.equal(redis.status, "wait", "a connection was opened");
  } finally {
    locks.close();
    redis.disconnect();
  }
});

interface Client {
  redis: RedisLike;
  /** Sends a command as an operator would (not through dlock). */
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
        redis.destroy();
      },
    };
  },
};

for (const [kind, make] of Object.entries(clients)) {
  describe(`sets with ${kind}`, { timeout: 60_000 }, () => {
    let server: Server;
    let client: Client;
    before(async () => {
      server = await Server.start();
      client = await make(server);
    });
    after(() => {
      client.close();
      server.stop();
    });
    // Each test starts from no lease and no waiter.
    const fresh = async (): Promise<void> => {
      await client.admin("FLUSHALL");
      await client.admin("CONFIG", "RESETSTAT");
    };

    /** A Locks on the shared client whose figures and log lines are recorded. */
    function recorded(): {
      locks: Locks;
      counts: Map<string, number>;
      lines: Record<string, unknown>[];
    } {
      const counts = new Map<string, number>();
      const count = (name: string): void => {
        counts.set(name, (counts.get(name) ?? 0) + 1);
      };
      const lines: Record<string, unknown>[] = [];
      const locks = new Locks(client.redis, {
        requestTimeout: 1000,
        metrics: {
          acquireAttempt: () => {
            count("attempt");
          },
          acquired: () => {
            count("acquired");
          },
          acquireFailed: (reason) => {
            count(`failed:${reason}`);
          },
          held: () => {
            count("held");
          },
          leaseLost: (reason) => {
            count(`lost:${reason}`);
          },
          releaseFailed: () => {
            count("releaseFailed");
          },
        },
        logger: {
          info: (message, fields) => lines.push({ message, ...fields }),
          warn: (message, fields) => lines.push({ message, ...fields }),
        },
      });
      return { locks, counts, lines };
    }

    const messages = (lines: Record<string, unknown>[], message: string): Record<string, unknown>[] =>
      lines.filter((line) => line["message"] === message);

    async function info(resource: string): Promise<Record<string, unknown>> {
      const reply = await client.admin("DLOCK.INFO", resource);
      if (reply === null) return {};
      const fields: Record<string, unknown> = {};
      if (reply instanceof Map) for (const [name, value] of reply) fields[String(name)] = value;
      else if (Array.isArray(reply)) for (let i = 0; i + 1 < reply.length; i += 2) fields[String(reply[i])] = reply[i + 1];
      else Object.assign(fields, reply);
      return fields;
    }

    async function calls(command: string): Promise<number> {
      const stats = String(await client.admin("INFO", "commandstats"));
      return Number(new RegExp(`cmdstat_${command.replace(".", "\\.")}:calls=(\\d+)`).exec(stats)?.[1] ?? 0);
    }

    async function exists(...keys: string[]): Promise<number> {
      return Number(await client.admin("EXISTS", ...keys));
    }

    async function listeners(resource: string): Promise<number> {
      const reply = (await client.admin("PUBSUB", "NUMSUB", channelName(resource))) as unknown[];
      return Number(reply[1]);
    }

    /** Resolves once check() holds; fails after ms. */
    async function until(what: string, check: () => Promise<boolean>, ms = 3_000): Promise<void> {
      const deadline = performance.now() + ms;
      while (!(await check())) {
        assert.ok(performance.now() < deadline, `never: ${what}`);
        await sleep(5);
      }
    }

    test("a set is granted whole, a fence per member in the order asked, renewed past its ttl and released whole", async () => {
      await fresh();
      const { locks, counts, lines } = recorded();
      try {
        const lease = await locks.holdAll(SET, { ttl: 600, wait: 0, meta: "worker-7" });
        assert.ok(lease instanceof SetLease);
        assert.deepEqual(lease.resources, SET);
        const [first, second] = lease.fences;
        assert.ok(first !== undefined && second !== undefined && second > first && first > 0, "a fence per member, in order");
        assert.equal(lease.fence(ALICE), first);
        assert.equal(lease.fence(BOB), second);
        assert.throws(() => lease.fence("{acct}:carol"), InvalidArgumentError);
        assert.equal(lease.mode, "exclusive");
        for (const resource of SET) {
          const found = await info(resource);
          assert.deepEqual([found["owner"], found["meta"]], [lease.token, "worker-7"]);
        }
        // Each member's write under its own fence.
        assert.equal(await lease.fenced(BOB, ["SET", "{acct}:ledger", "1"]), "OK");
        await assert.rejects(lease.fenced("{acct}:carol", ["SET", "{acct}:ledger", "2"]), InvalidArgumentError);
        let renewed = 0;
        lease.on("renewed", () => renewed++);
        await sleep(900); // past the ttl: RENEWALLs keep every member
        lease.check();
        assert.ok(renewed >= 2, `renewed ${String(renewed)} times`);
        assert.equal(await lease.fenceCheck(ALICE), true);
        assert.equal(await lease.fenceCheck(BOB), true);
        assert.ok((await calls("dlock.renewall")) >= 2);
        assert.equal(await calls("dlock.renew"), 0);
        await lease.release();
        assert.equal(lease.lost, null);
        assert.equal(await exists(...SET), 0, "every member released");
        assert.equal(await calls("dlock.releaseall"), 1);
        assert.equal(await calls("dlock.release"), 0);
        const named = { resource: SET.join(","), owner: lease.token, fence: `${String(first)},${String(second)}` };
        assert.deepEqual(messages(lines, "dlock: lease acquired"), [{ message: "dlock: lease acquired", ...named, mode: "exclusive" }]);
        assert.deepEqual(messages(lines, "dlock: lease released"), [{ message: "dlock: lease released", ...named }]);
        assert.deepEqual(Object.fromEntries(counts), { attempt: 1, acquired: 1, held: 1 });
      } finally {
        locks.close();
      }
    });

    test("a set with a held member is not acquired and takes nothing; a wait that ends leaves no ticket", async () => {
      await fresh();
      const { locks, counts } = recorded();
      try {
        const held = await locks.hold(BOB, { ttl: 10_000 });
        await assert.rejects(locks.holdAll(SET, { ttl: 10_000, wait: 0 }), (error) => error instanceof NotAcquiredError && error.resource === SET.join(","));
        assert.equal(await exists(ALICE), 0, "nothing of the set was taken");
        assert.equal((await info(BOB))["owner"], held.token);
        // With a wait that ends unsatisfied: its tickets leave every line.
        await assert.rejects(locks.holdAll(SET, { ttl: 10_000, wait: 300 }), NotAcquiredError);
        assert.equal(await exists(ALICE), 0);
        assert.equal((await info(BOB))["tickets"], 0, "withdrawn from the held member's line");
        // And when the caller's signal gives up.
        const controller = new AbortController();
        const waiting = locks.holdAll(SET, { ttl: 10_000, wait: 10_000, signal: controller.signal });
        await until("the set queued", async () => (await info(BOB))["tickets"] === 1);
        controller.abort(new Error("the caller gave up"));
        await assert.rejects(waiting, NotAcquiredError);
        assert.equal((await info(BOB))["tickets"], 0, "withdrawn after the abort");
        assert.equal(await exists(ALICE), 0);
        await held.release();
        assert.equal(counts.get("failed:held"), 3);
      } finally {
        locks.close();
      }
    });

    test("a waiting set keeps its place, holding nothing, and is granted when the member frees; a single waiter queued behind it comes next", async () => {
      await fresh();
      const { locks } = recorded();
      try {
        const held = await locks.hold(BOB, { ttl: 10_000 });
        // A ticket of 8 s is refreshed every 2.7 s: only a member's channel explains a prompt grant.
        let grantedAt = 0;
        const set = locks.holdAll(SET, { ttl: 10_000, wait: 8_000 }).then((lease) => {
          grantedAt = performance.now();
          return lease;
        });
        await until("the set queued on the free member", async () => (await info(ALICE))["tickets"] === 1);
        assert.equal((await info(ALICE))["holders"] ?? 0, 0, "the waiting set holds nothing");
        let single: number | null = null;
        const waiting = locks.hold(ALICE, { ttl: 10_000, wait: 8_000 }).then(async (lease) => {
          single = lease.fence;
          await lease.release();
        });
        await until("the single request waits", async () => (await info(ALICE))["waiters"] === 1);
        await sleep(100);
        assert.equal(single, null, "the single request waits behind the set, the member free or not");
        const released = performance.now();
        await held.release();
        const lease = await within(set, 5_000, "the set granted");
        assert.ok(grantedAt - released < 1_000, `granted ${(grantedAt - released).toFixed(0)} ms after the release`);
        assert.ok((lease.fences[1] ?? 0) > held.fence);
        assert.equal((await info(ALICE))["owner"], lease.token);
        assert.equal((await info(ALICE))["waiters"], 1);
        assert.equal(single, null);
        await lease.release();
        await within(waiting, 5_000, "the single waiter granted");
        assert.ok(single !== null && single > Math.max(...lease.fences), "the single waiter was granted once the set left");
      } finally {
        locks.close();
      }
    });

    test("an ACQUIREALL retried through a paused server keeps its token: the set is granted once, the same fences to every copy", async () => {
      await fresh();
      let failures = 0;
      const locks = new Locks(client.redis, { requestTimeout: 200, metrics: { acquireFailed: () => failures++ } });
      server.pause();
      const resume = setTimeout(() => {
        server.resume();
      }, 1_000);
      try {
        const lease = await locks.holdAll(SET, { ttl: 5_000, wait: 3_000 });
        for (const resource of SET) {
          const found = await info(resource);
          assert.deepEqual([found["owner"], Number(found["fence"])], [lease.token, lease.fence(resource)]);
        }
        assert.ok((await calls("dlock.acquireall")) >= 2, "the copy sent before the pause arrived");
        await lease.release();
        assert.equal(await exists(...SET), 0);
        assert.equal(failures, 0);
      } finally {
        clearTimeout(resume);
        server.resume();
        locks.close();
      }
    });

    test("an operator's DEL of one member loses the whole set (renewal_refused) within ttl/3, the rest released; its fences are stale", async () => {
      await fresh();
      const { locks, counts, lines } = recorded();
      try {
        const lease = await locks.holdAll(SET, { ttl: 600, wait: 0 });
        const lost = new Promise<LeaseLostError>((resolve) => lease.once("lost", resolve));
        assert.equal(await client.admin("DEL", BOB), 1);
        const deleted = performance.now();
        const error = await within(lost, 2_000, "the set lost");
        assert.ok(performance.now() - deleted < 200 + 300, "noticed by the next renewal");
        assert.equal(error.reason, "renewal_refused");
        assert.deepEqual(error.resources, SET);
        assert.deepEqual(error.fences, lease.fences);
        assert.equal(lease.signal.reason, error);
        assert.throws(() => {
          lease.check();
        }, LeaseLostError);
        await until("the rest of the set released", async () => (await exists(ALICE)) === 0);
        await assert.rejects(lease.release(), (thrown) => thrown === error);
        await assert.rejects(lease.fenced(ALICE, ["SET", "{acct}:ledger", "late"]), StaleError);
        assert.equal(await exists("{acct}:ledger"), 0);
        assert.equal(counts.get("lost:renewal_refused"), 1, "one set, one loss");
        assert.equal(counts.get("releaseFailed"), undefined);
        assert.deepEqual(
          messages(lines, "dlock: lease lost").map((line) => [line["resource"], line["fence"], line["reason"]]),
          [[SET.join(","), lease.fences.join(","), "renewal_refused"]],
        );
      } finally {
        locks.close();
      }
    });

    test("revoking one member loses the set at once (revoked), the other members released; its channels are left", async () => {
      await fresh();
      const { locks, counts } = recorded();
      try {
        // A ttl far above the test: only a member's channel can end the set in time.
        const lease = await locks.holdAll(SET, { ttl: 60_000, wait: 0 });
        await until("listening on every member", async () => (await listeners(ALICE)) === 1 && (await listeners(BOB)) === 1);
        const lost = new Promise<LeaseLostError>((resolve) => lease.once("lost", resolve));
        assert.equal(Number(await client.admin("DLOCK.REVOKE", BOB, "FENCE", String(lease.fence(BOB)), "REASON", "stuck")), 1);
        const error = await within(lost, 2_000, "the set lost");
        assert.equal(error.reason, "revoked");
        assert.equal(error.detail, "stuck");
        assert.ok(lease.signal.aborted);
        await until("the member not revoked released", async () => (await exists(ALICE)) === 0);
        assert.equal(await calls("dlock.releaseall"), 1, "the best-effort RELEASEALL");
        await assert.rejects(lease.release(), (thrown) => thrown === error);
        await until("the channels left", async () => (await listeners(ALICE)) + (await listeners(BOB)) === 0);
        assert.equal(counts.get("lost:revoked"), 1);
        assert.equal(counts.get("releaseFailed"), undefined);
      } finally {
        locks.close();
      }
    });

    test("a member gone before the release is the loss ended; await using releases the set", async () => {
      await fresh();
      const { locks, counts } = recorded();
      try {
        const lease = await locks.holdAll(SET, { ttl: 60_000, wait: 0 });
        // Released behind the client's back; the next renewal is 20 s away.
        assert.equal(Number(await client.admin("DLOCK.RELEASE", ALICE, lease.token)), 1);
        await assert.rejects(lease.release(), (error) => error instanceof LeaseLostError && error.reason === "ended");
        assert.equal(await exists(...SET), 0, "the other member released");
        {
          await using held = await locks.holdAll(SET, { ttl: 60_000, wait: 0 });
          assert.equal((await info(BOB))["owner"], held.token);
        }
        assert.equal(await exists(...SET), 0);
        assert.equal(counts.get("lost:ended"), 1);
        assert.equal(counts.get("releaseFailed"), undefined);
        assert.equal(counts.get("held"), 2);
      } finally {
        locks.close();
      }
    });

    test("usingAll returns the body's result, keeps its error, throws a loss; a stalled event loop or maxHold loses the set", async () => {
      await fresh();
      const { locks, counts } = recorded();
      try {
        assert.equal(await locks.usingAll(SET, { ttl: 5_000 }, (lease) => Promise.resolve(lease.fences.length)), 2);
        assert.equal(await exists(...SET), 0);
        const own = new Error("the work failed");
        await assert.rejects(
          locks.usingAll(SET, { ttl: 5_000 }, () => Promise.reject(own)),
          (error) => error === own,
        );
        await assert.rejects(
          locks.usingAll(SET, { ttl: 600 }, async (lease) => {
            await client.admin("DEL", ALICE);
            await sleep(1_000, undefined, { signal: lease.signal }).catch(() => undefined);
            assert.ok(lease.signal.aborted);
            return "finished anyway";
          }),
          (error) => error instanceof LeaseLostError && error.reason === "renewal_refused",
        );
        await assert.rejects(
          locks.usingAll(SET, { ttl: 300 }, (lease) => {
            block(lease.expiresAt - performance.now() + 200);
            return Promise.resolve("too late");
          }),
          (error) => error instanceof LeaseLostError && error.reason === "stalled",
        );
        // maxHold bounds the whole hold, renewed or not.
        await assert.rejects(
          locks.usingAll(SET, { ttl: 300, maxHold: 500 }, async (lease) => {
            await sleep(2_000, undefined, { signal: lease.signal }).catch(() => undefined);
          }),
          (error) => error instanceof LeaseLostError && error.reason === "max_hold",
        );
        assert.equal(await exists(...SET), 0);
        assert.equal(counts.get("lost:renewal_refused"), 1);
        assert.equal(counts.get("lost:stalled"), 1);
        assert.equal(counts.get("lost:max_hold"), 1);
      } finally {
        locks.close();
      }
    });
  });
}
