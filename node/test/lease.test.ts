// The lifecycle against a real server with the module, through ioredis and through node-redis,
// each with its default settings.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import {
  channelName,
  LeaseLostError,
  Locks,
  NotAcquiredError,
  ServerError,
  StaleError,
  InvalidArgumentError,
  DlockError,
  type RedisLike,
} from "../src/index.js";
import { Server } from "./kit.js";

/** Holds the event loop for ms: nothing else runs meanwhile (timers, sockets, renewals). */
function block(ms: number): void {
  const end = performance.now() + ms;
  while (performance.now() < end) {
    // busy: a blocked event loop, as a long synchronous computation makes one
  }
}

interface Client {
  redis: RedisLike;
  /** Sends a command as an operator would (not through dlock). */
  admin(...args: string[]): Promise<unknown>;
  close(): Promise<void> | void;
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
  describe(`with ${kind}`, { timeout: 60_000 }, () => {
    let server: Server;
    let client: Client;
    let locks: Locks;
    before(async () => {
      server = await Server.start();
      client = await make(server);
      locks = new Locks(client.redis, { requestTimeout: 1000 });
    });
    after(async () => {
      locks.close();
      await client.close();
      server.stop();
    });

    test("a lease is held with a fence, refused to another holder, released, then granted again with a larger fence", async () => {
      const first = await locks.hold("r1", { ttl: 5_000 });
      assert.ok(first.fence > 0 && Number.isSafeInteger(first.fence));
      await assert.rejects(locks.hold("r1", { ttl: 5_000, wait: 0 }), (error) => {
        assert.ok(error instanceof NotAcquiredError && error instanceof DlockError);
        assert.equal(error.code, "ERR_DLOCK_NOT_ACQUIRED");
        return true;
      });
      assert.equal(await first.fenceCheck(), true);
      await first.release();
      const second = await locks.hold("r1", { ttl: 5_000, wait: 0 });
      assert.ok(second.fence > first.fence);
      assert.equal(await first.fenceCheck(), false);
      await second.release();
    });

    test("await using releases at the end of the block", async () => {
      {
        await using lease = await locks.hold("r2", { ttl: 5_000 });
        assert.equal((await locks.info("r2"))?.owner, lease.token);
      }
      assert.equal((await locks.info("r2"))?.owner ?? null, null);
    });

    test("renewals keep a lease past its ttl", async () => {
      const lease = await locks.hold("r3", { ttl: 600 });
      let renewed = 0;
      lease.on("renewed", () => renewed++);
      await sleep(1_300);
      lease.check();
      assert.ok(renewed >= 3, `renewed ${String(renewed)} times`);
      assert.equal(await lease.fenceCheck(), true);
      await lease.release();
    });

    test("an operator's DEL: the lease is lost (renewal_refused) within ttl/3, its signal aborted with the reason", async () => {
      const lease = await locks.hold("r4", { ttl: 900 });
      const lost = new Promise<LeaseLostError>((resolve) => lease.once("lost", resolve));
      const started = performance.now();
      await client.admin("DEL", "r4");
      const error = await lost;
      assert.ok(performance.now() - started < 450);
      assert.equal(error.reason, "renewal_refused");
      assert.ok(lease.signal.aborted);
      assert.equal(lease.signal.reason, error);
      assert.throws(() => {
        lease.check();
      }, LeaseLostError);
      await assert.rejects(lease.release(), LeaseLostError);
      await assert.rejects(lease.fenced(["SET", "r4:data", "x"]), StaleError);
    });

    test("a waiter is handed the lease when the holder releases, and claims it", async () => {
      const holder = await locks.hold("r5", { ttl: 5_000 });
      const waiting = locks.hold("r5", { ttl: 5_000, wait: 5_000 });
      await sleep(200);
      await holder.release();
      const next = await waiting;
      assert.ok(next.fence > holder.fence);
      assert.equal((await locks.info("r5"))?.owner, next.token);
      await next.release();
    });

    test("tickets: a waiter subscribed to the channel is handed the lease", async () => {
      const holder = await locks.hold("r6", { ttl: 5_000 });
      const started = performance.now();
      const waiting = locks.hold("r6", { ttl: 5_000, wait: 5_000, strategy: "tickets", ticket: 3_000 });
      await sleep(200);
      await holder.release();
      const next = await waiting;
      // Woken by the hand-over, not by the ticket's refresh (every second).
      assert.ok(performance.now() - started < 900, `took ${String(performance.now() - started)} ms`);
      assert.ok(next.fence > holder.fence);
      await next.release();
    });

    test("the caller's AbortSignal cancels a wait, and nothing is left in line", async () => {
      const holder = await locks.hold("r7", { ttl: 5_000 });
      const controller = new AbortController();
      const waiting = locks.hold("r7", { ttl: 5_000, wait: 10_000, signal: controller.signal });
      await sleep(200);
      assert.equal((await locks.info("r7"))?.waiters, 1);
      controller.abort(new Error("the caller gave up"));
      await assert.rejects(waiting, NotAcquiredError);
      await sleep(50);
      assert.equal((await locks.info("r7"))?.waiters, 0);
      await holder.release();
      assert.equal((await locks.info("r7"))?.owner ?? null, null);
    });

    test("an abort while a granting ACQUIRE is in flight releases the grant", async () => {
      const controller = new AbortController();
      server.pause();
      let attempt: Promise<unknown> = Promise.resolve();
      try {
        attempt = locks.hold("r7b", { ttl: 5_000, signal: controller.signal });
        await sleep(100);
        controller.abort(new Error("the caller gave up"));
        await sleep(50);
      } finally {
        server.resume();
      }
      await assert.rejects(attempt, NotAcquiredError);
      assert.equal((await locks.info("r7b"))?.owner ?? null, null, "the grant was released");
    });

    test("using returns the body's result, keeps the body's error, and throws a loss", async () => {
      assert.equal(await locks.using("r8", { ttl: 5_000 }, (lease) => Promise.resolve(lease.fence > 0 ? "done" : "no")), "done");
      const own = new Error("the work failed");
      await assert.rejects(
        locks.using("r8", { ttl: 5_000 }, async () => {
          await client.admin("DEL", "r8");
          throw own;
        }),
        (error) => error === own,
      );
      await assert.rejects(
        locks.using("r8", { ttl: 900 }, async (lease) => {
          await client.admin("DEL", "r8");
          await sleep(450);
          assert.ok(lease.signal.aborted);
          return "finished anyway";
        }),
        (error) => error instanceof LeaseLostError && error.reason === "renewal_refused",
      );
    });

    test("fenced writes run under the live fence and are refused with a stale one", async () => {
      const old = await locks.hold("{r9}", { ttl: 5_000 });
      assert.equal(await old.fenced(["SET", "{r9}:data", "old"]), "OK");
      await old.release();
      const current = await locks.hold("{r9}", { ttl: 5_000 });
      await assert.rejects(old.fenced(["SET", "{r9}:data", "late"]), (error) => error instanceof StaleError && error.code === "ERR_DLOCK_STALE");
      assert.equal(await client.admin("GET", "{r9}:data"), "old");
      await current.release();
    });

    test("read/write: readers share, a writer waits for them", async () => {
      const a = await locks.read("rw", { ttl: 5_000 });
      const b = await locks.read("rw", { ttl: 5_000, wait: 0 });
      await assert.rejects(locks.write("rw", { ttl: 5_000, wait: 0 }), NotAcquiredError);
      await a.release();
      await b.release();
      const writer = await locks.write("rw", { ttl: 5_000, wait: 0 });
      await assert.rejects(locks.read("rw", { ttl: 5_000, wait: 0 }), NotAcquiredError);
      await writer.release();
    });

    test("a semaphore grants its permits and no more", async () => {
      const held = [await locks.semaphore("sem", 2, { ttl: 5_000 }), await locks.semaphore("sem", 2, { ttl: 5_000 })];
      await assert.rejects(locks.semaphore("sem", 2, { ttl: 5_000, wait: 0 }), NotAcquiredError);
      await assert.rejects(locks.semaphore("sem", 0), InvalidArgumentError);
      for (const lease of held) await lease.release();
    });

    test("maxHold ends the lease (max_hold) however it is renewed", async () => {
      const lease = await locks.hold("r10", { ttl: 300, maxHold: 500 });
      const lost = await new Promise<LeaseLostError>((resolve) => lease.once("lost", resolve));
      assert.equal(lost.reason, "max_hold");
    });

    test("a loss whose release fails (the client closed) leaves no unhandled rejection: the failure is emitted, not counted", async () => {
      const unhandled: unknown[] = [];
      const onUnhandled = (reason: unknown): void => {
        unhandled.push(reason);
      };
      process.on("unhandledRejection", onUnhandled);
      const own = await make(server);
      let releaseFailures = 0;
      const ownLocks = new Locks(own.redis, { requestTimeout: 200, metrics: { releaseFailed: () => releaseFailures++ } });
      try {
        const lease = await ownLocks.hold("r12", { ttl: 600 });
        const errors: unknown[] = [];
        lease.on("error", (error: unknown) => errors.push(error));
        const lost = new Promise<LeaseLostError>((resolve) => lease.once("lost", resolve));
        // Every request from now on fails at once: the renewals, then the RELEASE after the loss.
        await own.close();
        assert.equal((await lost).reason, "unreachable");
        // Nobody awaits the release the loss sent: its failure must not be an unhandled rejection.
        await sleep(200);
        assert.deepEqual(unhandled, []);
        // The best-effort RELEASE after a loss is no release failure, whatever it answers.
        assert.equal(releaseFailures, 0);
        assert.ok(errors.length >= 2, `${String(errors.length)} error events`); // renewals and the release
        await assert.rejects(lease.release(), (error) => error instanceof LeaseLostError && error.reason === "unreachable");
      } finally {
        process.off("unhandledRejection", onUnhandled);
        ownLocks.close();
      }
    });

    /** A Locks on the shared client whose losses, release failures and warnings are recorded. */
    function recorded(requestTimeout = 1000): { locks: Locks; losses: string[]; releaseFailures: () => number; warnings: Record<string, unknown>[] } {
      const losses: string[] = [];
      const warnings: Record<string, unknown>[] = [];
      let releaseFailures = 0;
      const watched = new Locks(client.redis, {
        requestTimeout,
        metrics: { leaseLost: (reason) => losses.push(reason), releaseFailed: () => releaseFailures++ },
        logger: {
          info: () => undefined,
          warn: (message, fields) => warnings.push({ message, ...fields }),
        },
      });
      return { locks: watched, losses, releaseFailures: () => releaseFailures, warnings };
    }

    /** The warnings logged with this message. */
    const logged = (warnings: Record<string, unknown>[], message: string): Record<string, unknown>[] =>
      warnings.filter((line) => line["message"] === message);

    async function commandCalls(command: string): Promise<number> {
      const stats = String(await client.admin("INFO", "commandstats"));
      return Number(new RegExp(`cmdstat_${command.replace(".", "\\.")}:calls=(\\d+)`).exec(stats)?.[1] ?? 0);
    }

    test("an event loop blocked past the ttl: the lease is lost as stalled (check, renew, the renewer), and no RENEW is sent after the expiry", async () => {
      const { locks: watched, losses, releaseFailures, warnings } = recorded();
      try {
        const checked = await watched.hold("st1", { ttl: 300 });
        const renewed = await watched.hold("st2", { ttl: 300 });
        const timed = await watched.hold("st3", { ttl: 300 });
        const lost = new Promise<LeaseLostError>((resolve) => timed.once("lost", resolve));
        const renewsBefore = await commandCalls("dlock.renew");
        // Their first renewals were due 100 ms after the grants: the event loop runs nothing
        // until well past the local expiries (300 ms).
        block(checked.expiresAt - performance.now() + 200);
        assert.throws(
          () => {
            checked.check();
          },
          (error) => error instanceof LeaseLostError && error.reason === "stalled",
        );
        assert.equal(await renewed.renew(), false);
        assert.equal(renewed.lost?.reason, "stalled");
        assert.equal((await lost).reason, "stalled");
        assert.ok(timed.signal.aborted);
        for (const lease of [checked, renewed, timed]) await assert.rejects(lease.release(), (error) => error instanceof LeaseLostError && error.reason === "stalled");
        assert.equal(await commandCalls("dlock.renew"), renewsBefore, "a RENEW was sent after the local expiry");
        assert.deepEqual(losses, ["stalled", "stalled", "stalled"]);
        assert.deepEqual(
          logged(warnings, "dlock: lease lost").map((line) => line["reason"]),
          ["stalled", "stalled", "stalled"],
        );
        // The best-effort RELEASEs after the losses (answered 0: the server's deadline passed too).
        assert.equal(releaseFailures(), 0);
        assert.deepEqual(logged(warnings, "dlock: release failed"), []);
      } finally {
        watched.close();
      }
    });

    test("await using whose block holds the event loop past the ttl: the block's end throws the loss stalled, not ended", async () => {
      const { locks: watched, losses, releaseFailures, warnings } = recorded();
      try {
        await assert.rejects(
          (async () => {
            await using lease = await watched.hold("st4", { ttl: 300 });
            block(lease.expiresAt - performance.now() + 200);
          })(),
          (error) => error instanceof LeaseLostError && error.reason === "stalled",
        );
        assert.deepEqual(losses, ["stalled"]);
        assert.equal(releaseFailures(), 0);
        assert.deepEqual(logged(warnings, "dlock: release failed"), []);
      } finally {
        watched.close();
      }
    });

    test("a paused server (SIGSTOP) past the ttl: the lease is lost as unreachable, and the RELEASE after it is no release failure", async () => {
      const { locks: watched, losses, releaseFailures, warnings } = recorded(200);
      try {
        const lease = await watched.hold("st5", { ttl: 600 });
        const lost = new Promise<LeaseLostError>((resolve) => lease.once("lost", resolve));
        server.pause();
        try {
          assert.equal((await lost).reason, "unreachable");
          // The best-effort RELEASE gets no answer either (200 ms).
          await assert.rejects(lease.release(), (error) => error instanceof LeaseLostError && error.reason === "unreachable");
        } finally {
          server.resume();
        }
        assert.deepEqual(losses, ["unreachable"]);
        assert.equal(releaseFailures(), 0);
        assert.deepEqual(logged(warnings, "dlock: release failed"), []);
      } finally {
        watched.close();
      }
    });

    test("lost, then released (an operator's DEL at the hold's end, refused renewal, revocation): one loss each, no release failure", async () => {
      const { locks: watched, losses, releaseFailures, warnings } = recorded();
      try {
        // DEL while the first renewal is far off: the RELEASE at the hold's end answers 0.
        const ended = await watched.hold("st6", { ttl: 30_000 });
        await client.admin("DEL", "st6");
        await assert.rejects(ended.release(), (error) => error instanceof LeaseLostError && error.reason === "ended");
        // DEL, then the next renewal is refused; the release after it.
        const refused = await watched.hold("st7", { ttl: 600 });
        const lost = new Promise<LeaseLostError>((resolve) => refused.once("lost", resolve));
        await client.admin("DEL", "st7");
        assert.equal((await lost).reason, "renewal_refused");
        await assert.rejects(refused.release(), LeaseLostError);
        // Revoked, then released (no RELEASE is sent).
        const revoked = await watched.hold("st8", { ttl: 30_000 });
        const gone = new Promise<LeaseLostError>((resolve) => revoked.once("lost", resolve));
        await untilListeners("st8", 1);
        await client.admin("DLOCK.REVOKE", "st8");
        assert.equal((await gone).reason, "revoked");
        await assert.rejects(revoked.release(), LeaseLostError);
        assert.deepEqual(losses, ["ended", "renewal_refused", "revoked"]);
        assert.deepEqual(
          logged(warnings, "dlock: lease lost").map((line) => line["reason"]),
          ["ended", "renewal_refused", "revoked"],
        );
        assert.equal(releaseFailures(), 0);
        assert.deepEqual(logged(warnings, "dlock: release failed"), []);
      } finally {
        watched.close();
      }
    });

    /** How many clients are subscribed to resource's channel (PUBSUB NUMSUB). */
    async function listeners(resource: string): Promise<number> {
      const reply = (await client.admin("PUBSUB", "NUMSUB", channelName(resource))) as unknown[];
      return Number(reply[1]);
    }

    /** Resolves once resource's channel has `count` subscribers; fails after 3 s. */
    async function untilListeners(resource: string, count: number): Promise<void> {
      const deadline = performance.now() + 3_000;
      while ((await listeners(resource)) !== count) {
        assert.ok(performance.now() < deadline, `${resource}: never ${String(count)} subscriber(s) on its channel`);
        await sleep(5);
      }
    }

    async function releaseCalls(): Promise<number> {
      const stats = String(await client.admin("INFO", "commandstats"));
      return Number(/cmdstat_dlock\.release:calls=(\d+)/.exec(stats)?.[1] ?? 0);
    }

    test("an operator's DLOCK.REVOKE: the holder loses the lease at once (revoked, the reason as detail), sends no RELEASE, and leaves the channel", async (t) => {
      const unhandled: unknown[] = [];
      const onUnhandled = (reason: unknown): void => {
        unhandled.push(reason);
      };
      process.on("unhandledRejection", onUnhandled);
      const losses: string[] = [];
      const lines: Record<string, unknown>[] = [];
      const watched = new Locks(client.redis, {
        requestTimeout: 1000,
        metrics: { leaseLost: (reason) => losses.push(reason) },
        logger: {
          info: () => undefined,
          warn: (message, fields) => {
            if (message === "dlock: lease lost") lines.push(fields);
          },
        },
      });
      const afterReply: number[] = [];
      const afterSend: number[] = [];
      try {
        const releasesBefore = await releaseCalls();
        const rounds = 20;
        for (let round = 0; round < rounds; round++) {
          // The last round revokes without a reason: the detail is then empty.
          const reason = round === rounds - 1 ? null : `stuck since 03:00, incident ${String(round)}`;
          // A ttl whose first renewal (10 s) is far off: only the channel can tell of the revocation.
          const lease = await watched.hold("rv1", { ttl: 30_000 });
          await untilListeners("rv1", 1);
          let aborted = 0;
          lease.signal.addEventListener("abort", () => {
            aborted = performance.now();
          });
          const lost = new Promise<LeaseLostError>((resolve) => lease.once("lost", resolve));
          const sent = performance.now();
          const revoked = await client.admin("DLOCK.REVOKE", "rv1", ...(reason === null ? [] : ["REASON", reason]));
          const replied = performance.now();
          assert.equal(Number(revoked), 1);
          const error = await lost;
          afterReply.push(aborted - replied);
          afterSend.push(aborted - sent);
          assert.ok(error instanceof LeaseLostError);
          assert.equal(error.reason, "revoked");
          assert.equal(error.detail, reason ?? "");
          assert.equal(error.fence, lease.fence);
          assert.equal(lease.signal.reason, error);
          assert.equal(lease.lost, error);
          assert.throws(() => {
            lease.check();
          }, (thrown) => thrown === error);
          await assert.rejects(lease.release(), (thrown) => thrown === error);
          await assert.rejects(lease.fenced(["SET", "rv1:data", "x"]), StaleError);
          assert.equal(await lease.fenceCheck(), false);
        }
        assert.deepEqual(losses, Array<string>(rounds).fill("revoked"));
        assert.equal(lines.length, rounds);
        assert.equal(lines[0]?.["reason"], "revoked");
        assert.equal(lines[0]?.["detail"], "stuck since 03:00, incident 0");
        assert.equal(lines[0]?.["resource"], "rv1");
        assert.equal(lines[rounds - 1]?.["detail"], undefined);
        // No RELEASE after a revocation, neither at the loss nor from release().
        assert.equal(await releaseCalls(), releasesBefore);
        // The channel is left once no lease needs it.
        await untilListeners("rv1", 0);
        assert.deepEqual(unhandled, []);
      } finally {
        process.off("unhandledRejection", onUnhandled);
        watched.close();
      }
      const median = (values: number[]): number => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? NaN;
      t.diagnostic(
        `${kind}: revocation to abort, from the REVOKE reply: median ${median(afterReply).toFixed(2)} ms, ` +
          `max ${Math.max(...afterReply).toFixed(2)} ms; from its send: median ${median(afterSend).toFixed(2)} ms, ` +
          `max ${Math.max(...afterSend).toFixed(2)} ms (${String(afterReply.length)} revocations)`,
      );
    });

    test("a revocation of another lease (another reader's fence) leaves the holder alone", async () => {
      const a = await locks.read("rv2", { ttl: 30_000 });
      const b = await locks.read("rv2", { ttl: 30_000, wait: 0 });
      // One subscriber per server: both readers listen through it.
      await untilListeners("rv2", 1);
      const bLost = new Promise<LeaseLostError>((resolve) => b.once("lost", resolve));
      // Messages for fences that are not a's: another lease's, one beyond 2^53, a malformed one.
      await client.admin("PUBLISH", channelName("rv2"), `revoked ${String(Math.max(a.fence, b.fence) + 1)} not yours`);
      await client.admin("PUBLISH", channelName("rv2"), "revoked 18446744073709551615 not yours either");
      await client.admin("PUBLISH", channelName("rv2"), `revoked x${String(a.fence)}`);
      assert.equal(Number(await client.admin("DLOCK.REVOKE", "rv2", "FENCE", String(b.fence), "REASON", "reader b only")), 1);
      const error = await bLost;
      assert.equal(error.reason, "revoked");
      assert.equal(error.detail, "reader b only");
      // Whatever a could have heard by now, it has: PING's reply comes after the messages above.
      await client.admin("PING");
      await sleep(20);
      assert.equal(a.lost, null);
      assert.equal(a.signal.aborted, false);
      a.check();
      assert.equal(await a.fenceCheck(), true);
      assert.equal(await listeners("rv2"), 1, "a still listens");
      await a.release();
      await untilListeners("rv2", 0);
    });

    test("a mode conflict is a server error with its class", async () => {
      await client.admin("DLOCK.ACQUIRE", "r11", "t", "5000");
      await assert.rejects(locks.fenced("r11", 1, ["NOSUCHCOMMAND"]), (error) => error instanceof StaleError || error instanceof ServerError);
    });

    test("campaign and observe: the observer sees each leader, then nobody", { timeout: 10_000 }, async () => {
      const controller = new AbortController();
      const seen: (string | null)[] = [];
      const observing = (async () => {
        for await (const leader of locks.observe("election", { signal: controller.signal, interval: 500 })) {
          seen.push(leader?.address ?? null);
        }
      })();
      await sleep(100);
      const a = await locks.campaign("election", "10.0.0.1:80", { ttl: 2_000 });
      const bCampaign = locks.campaign("election", "10.0.0.2:80", { ttl: 2_000 });
      await sleep(200);
      await a.release();
      const b = await bCampaign;
      assert.ok(b.fence > a.fence);
      await sleep(300);
      await b.release();
      await sleep(300);
      controller.abort();
      await observing;
      assert.deepEqual(seen, [null, "10.0.0.1:80", "10.0.0.2:80", null]);
    });
  });
}
