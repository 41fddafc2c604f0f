// Tickets told on their own channel (ACQUIRE … QUEUE … NOTIFY), against a real server with the
// module, through ioredis and through node-redis: a ticket starts on its `granted` message and
// its claim is the lease's first renewal; a server without NOTIFY (played by a proxy that
// renames the option) is waited on through the resource's channel.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { Redis } from "ioredis";
import { createClient } from "redis";

import { channelName, Locks, type RedisLike } from "../src/index.js";
import { ticketChannelName } from "../src/protocol.js";
import { Proxy, Server } from "./kit.js";

/** How long a check may take on a loaded machine. */
const SLACK = 3_000;

interface Client {
  redis: RedisLike;
  close(): void;
}

const clients: Record<string, (port: number) => Promise<Client>> = {
  ioredis: (port) => {
    const redis = new Redis({ port, host: "127.0.0.1" });
    return Promise.resolve({
      redis,
      close: () => {
        redis.disconnect();
      },
    });
  },
  "node-redis": async (port) => {
    const redis = createClient({ url: `redis://127.0.0.1:${String(port)}` });
    redis.on("error", () => undefined);
    await redis.connect();
    return {
      redis,
      close: () => {
        redis.destroy();
      },
    };
  },
};

for (const [kind, make] of Object.entries(clients)) {
  describe(`tickets on their own channel, with ${kind}`, { timeout: 60_000 }, () => {
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

    /** How many calls of command the server has run (INFO commandstats). */
    async function calls(command: string): Promise<number> {
      const stats = String(await admin.call("INFO", "commandstats"));
      return Number(new RegExp(`cmdstat_${command.replace(".", "\\.")}:calls=(\\d+)`).exec(stats)?.[1] ?? 0);
    }

    /** A field of DLOCK.INFO resource, as text (undefined without one). */
    async function field(resource: string, name: string): Promise<string | undefined> {
      const reply = (await admin.call("DLOCK.INFO", resource)) as unknown[] | null;
      if (reply === null) return undefined;
      const at = reply.findIndex((item) => String(item) === name);
      return at < 0 ? undefined : String(reply[at + 1]);
    }

    async function until(what: string, check: () => Promise<boolean>): Promise<void> {
      const deadline = performance.now() + SLACK;
      while (!(await check())) {
        assert.ok(performance.now() < deadline, `never ${what}`);
        await sleep(5);
      }
    }

    const subscribers = async (channel: string): Promise<number> =>
      Number(((await admin.call("PUBSUB", "NUMSUB", channel)) as unknown[])[1]);
    const channels = async (pattern: string): Promise<string[]> => (await admin.call("PUBSUB", "CHANNELS", pattern)) as string[];

    test("a ticket starts on its own message: no ACQUIRE claims the turn, its claim is the first renewal, sent unasked", async () => {
      const resource = `gate:${kind}`;
      const client = await make(server.port);
      const ticket = 9_000;
      const ttl = 60_000;
      const locks = new Locks(client.redis, { requestTimeout: 1000, strategy: "tickets", ticket });
      try {
        assert.notEqual(await admin.call("DLOCK.ACQUIRE", resource, "holder", "30000"), null, "held");
        const waiting = locks.hold(resource, { ttl, wait: 20_000 });
        await until("the ticket in line", async () => (await field(resource, "tickets")) === "1");
        // Subscribed to its own channel, not to the resource's.
        await until("the ticket's own channel subscribed", async () => (await channels(`${channelName(resource)}:*`)).length === 1);
        assert.equal(await subscribers(channelName(resource)), 0, "not on the resource's channel");
        await sleep(100); // the first ACQUIRE answered
        const acquires = await calls("dlock.acquire");
        const renewals = await calls("dlock.renew");
        const released = performance.now();
        assert.equal(Number(await admin.call("DLOCK.RELEASE", resource, "holder")), 1, "released");
        const lease = await waiting;
        // Read before anything else runs: the claim's answer is not read yet.
        const window = lease.expiresAt - released;
        assert.equal(await calls("dlock.acquire"), acquires, "no ACQUIRE claimed the turn");
        assert.ok(window <= ticket, `the claim window, not the ttl, until the claim is read: ${String(window)} ms`);
        assert.ok(window > ticket - SLACK, `${String(window)} ms`);
        assert.deepEqual(await channels(`${channelName(resource)}:*`), [], "the ticket's channel is left");
        assert.ok(!(await channels("*")).includes(ticketChannelName(resource, lease.token)));
        // The claim went out without the caller asking: the server's lease runs the full ttl.
        await until("claimed to the full ttl", async () => Number((await field(resource, "ttl-ms")) ?? 0) > ticket);
        assert.equal(await field(resource, "fence"), String(lease.fence));
        assert.equal(await field(resource, "owner"), lease.token);
        // The first renewal read the claim's answer: the ttl counts from the claim's send.
        await until("the claim read as the first renewal", () => Promise.resolve(lease.expiresAt > performance.now() + ttl - SLACK));
        assert.equal(await calls("dlock.renew"), renewals + 1, "the claim was the one renewal");
        assert.equal(lease.lost, null);
        await lease.release();
        assert.equal(await field(resource, "owner"), undefined);
      } finally {
        locks.close();
        client.close();
      }
    });

    test("a server without NOTIFY is waited on through the resource's channel, and never asked with NOTIFY again", async () => {
      const resource = `old:${kind}`;
      const proxy = await Proxy.start(server.port);
      // An older server: the option renamed on its way in, the complaint renamed back on its way out.
      proxy.rewrite(false, "$6\r\nNOTIFY\r\n", "$6\r\nXOTIFY\r\n");
      proxy.rewrite(true, "'XOTIFY'", "'NOTIFY'");
      const client = await make(proxy.port);
      const locks = new Locks(client.redis, { requestTimeout: 1000, strategy: "tickets", ticket: 9_000 });
      try {
        for (let round = 0; round < 2; round++) {
          assert.notEqual(await admin.call("DLOCK.ACQUIRE", resource, "holder", "30000"), null, "held");
          const waiting = locks.hold(resource, { ttl: 30_000, wait: 20_000 });
          await until("the ticket in line", async () => (await field(resource, "tickets")) === "1");
          await until("the resource's channel subscribed", async () => (await subscribers(channelName(resource))) === 1);
          assert.deepEqual(await channels(`${channelName(resource)}:*`), [], `round ${String(round)}: no ticket channel`);
          await sleep(300);
          const released = performance.now();
          assert.equal(Number(await admin.call("DLOCK.RELEASE", resource, "holder")), 1, "released");
          const lease = await waiting;
          const woke = performance.now() - released;
          assert.ok(woke < 1_000, `round ${String(round)}: by the channel, not the refresh: ${String(woke)} ms`);
          assert.ok(lease.expiresAt > performance.now() + 20_000, "claimed by its ACQUIRE");
          assert.equal(await field(resource, "owner"), lease.token);
          await lease.release();
        }
        // NOTIFY was sent once, refused, and never again.
        assert.deepEqual(proxy.rewritten, [1, 1], "one ACQUIRE with NOTIFY, one refusal");
      } finally {
        locks.close();
        client.close();
        proxy.stop();
      }
    });
  });
}
