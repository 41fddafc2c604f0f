// A session of the conformance driver as the harness runs one: requests in, one reply per id,
// events unprompted, with each client.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { Server } from "./kit.js";
import { VERSION } from "../src/version.js";

let server: Server;
before(async () => {
  server = await Server.start();
});
after(() => {
  server.stop();
});

for (const client of ["ioredis", "node-redis"]) {
  test(`the driver (${client}) answers every request and reports a loss`, { timeout: 20_000 }, async (t) => {
    const driver = spawn(process.execPath, [join(import.meta.dirname, "..", "..", "dist", "esm", "driver.js")], {
      env: { ...process.env, DLOCK_URL: server.url, DLOCK_CLIENT: client },
      stdio: ["pipe", "pipe", "inherit"],
    });
    // A failed assertion leaves it running: it must not keep the test process alive.
    t.after(() => {
      if (driver.exitCode === null) driver.kill("SIGKILL");
    });
    const lines = createInterface({ input: driver.stdout })[Symbol.asyncIterator]();
    const next = async (): Promise<Record<string, unknown>> => {
      const line = await lines.next();
      assert.ok(line.done !== true, "the driver closed stdout");
      return JSON.parse(line.value) as Record<string, unknown>;
    };
    const send = async (request: object): Promise<Record<string, unknown>> => {
      driver.stdin.write(`${JSON.stringify(request)}\n`);
      return next();
    };
    const kind = (reply: Record<string, unknown>): unknown => (reply["error"] as { kind?: unknown } | undefined)?.kind;
    const r = `r-${client}`;
    assert.deepEqual(await next(), { event: "ready", client: `@dlock/client ${VERSION} (${client})` });
    const granted = await send({ id: 1, op: "hold", lease: "a", resource: r, ttl_ms: 900 });
    const ok = granted["ok"] as { fence?: unknown; token?: unknown };
    assert.equal(granted["id"], 1);
    assert.ok(typeof ok.fence === "number" && typeof ok.token === "string");
    assert.equal(kind(await send({ id: 2, op: "hold", lease: "b", resource: r, ttl_ms: 900, wait_ms: 100 })), "held");
    assert.equal(kind(await send({ id: 3, op: "run", lease: "a", work_ms: 50, fail: true })), "work");
    await send({ id: 4, op: "hold", lease: "c", resource: r, ttl_ms: 900 });
    const admin = server.ioredis();
    await admin.del(r); // an operator's DEL: lost within ttl/3
    admin.disconnect();
    assert.deepEqual(await next(), { event: "lost", lease: "c", reason: "renewal_refused" });
    const stale = await send({ id: 5, op: "fenced", lease: "c", command: ["SET", `${r}:data`, "x"] });
    assert.equal(stale["id"], 5);
    assert.equal(kind(stale), "stale");
    assert.equal(kind(await send({ id: 6, op: "semaphore", lease: "s", resource: "p", permits: 0, ttl_ms: 900 })), "usage");
    // Stopped (SIGSTOP) past its ttl with the server reachable, then resumed: it never got to
    // renew (stalled), and no RENEW was sent after the local expiry.
    await send({ id: 7, op: "hold", lease: "d", resource: `${r}:stopped`, ttl_ms: 600 });
    driver.kill("SIGSTOP");
    await sleep(900);
    driver.kill("SIGCONT");
    assert.deepEqual(await next(), { event: "lost", lease: "d", reason: "stalled" });
    const done = new Promise<number | null>((resolve) => driver.once("exit", resolve));
    driver.stdin.end();
    assert.equal(await done, 0);
  });
}
