#!/usr/bin/env node
// The conformance driver (docs/protocol.md, section 14): one JSON request per line on stdin, one
// JSON reply (or event) per line on stdout, logs on stderr. It connects to $DLOCK_URL (a
// redis:// URL, or several separated by commas for a cluster's seeds) with ioredis, or with
// node-redis when $DLOCK_CLIENT is "node-redis"; writes {"event": "ready"}; serves requests
// concurrently; and exits when stdin closes (after answering the requests already read, for at
// most 2 s), releasing nothing on purpose.

import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";

import { Locks } from "./locks.js";
import { VERSION } from "./version.js";
import { Lease, SetLease, type Held } from "./lease.js";
import {
  DlockError,
  InvalidArgumentError,
  LeaseLostError,
  NotAcquiredError,
  NotReleasedError,
  ServerError,
  StaleError,
  UnknownOutcomeError,
  UnreachableError,
} from "./errors.js";
import type { HoldOptions } from "./options.js";
import type { RedisLike } from "./adapters.js";

const CLOSING_GRACE = 2_000;

interface Request {
  id?: number;
  op?: string;
  lease?: string;
  resource?: string;
  resources?: string[];
  name?: string;
  address?: string;
  ttl_ms?: number;
  wait_ms?: number;
  ticket_ms?: number;
  strategy?: string;
  meta?: string;
  max_hold_ms?: number;
  mode?: string;
  permits?: number;
  command?: string[];
  work_ms?: number;
  fail?: boolean;
}

/** The work's own failure (run with fail set). */
class WorkError extends Error {}

function write(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value)}\n`);
}

/** An error reply's body: its kind (section 14) and details. */
export function describe(error: unknown): Record<string, unknown> {
  const detail = error instanceof Error ? error.message : String(error);
  if (error instanceof WorkError) return { kind: "work", detail };
  if (error instanceof InvalidArgumentError) return { kind: "usage", detail };
  if (error instanceof LeaseLostError) return { kind: "lost", detail, reason: error.reason };
  if (error instanceof NotReleasedError) return { kind: "not_released", detail };
  if (error instanceof StaleError) return { kind: "stale", detail };
  if (error instanceof NotAcquiredError) return { kind: "held", detail };
  if (error instanceof UnreachableError) return { kind: "unreachable", detail };
  if (error instanceof UnknownOutcomeError) return { kind: "unknown", detail, token: error.token, released: error.released };
  if (error instanceof ServerError) return { kind: error.class, detail };
  if (error instanceof DlockError) return { kind: "server", detail };
  return { kind: "unknown", detail };
}

/** An inner reply as replies.json writes it: maps as {"map": [[name, value], …]}. */
function encode(reply: unknown): unknown {
  if (Array.isArray(reply)) return reply.map(encode);
  if (reply instanceof Map) return { map: [...reply].map(([k, v]) => [encode(k), encode(v)]) };
  if (Buffer.isBuffer(reply)) return reply.toString("utf8");
  if (reply !== null && typeof reply === "object") return { map: Object.entries(reply).map(([k, v]) => [k, encode(v)]) };
  return reply ?? null;
}

async function connect(url: string): Promise<RedisLike> {
  const urls = url.split(",").map((u) => u.trim()).filter((u) => u !== "");
  const first = urls[0];
  if (first === undefined) throw new Error("DLOCK_URL is not set");
  if (process.env["DLOCK_CLIENT"] === "node-redis") {
    const { createClient, createCluster } = await import("redis");
    if (urls.length === 1) {
      const client = createClient({ url: first });
      client.on("error", (error: unknown) => {
        console.error("node-redis:", error);
      });
      await client.connect();
      return client;
    }
    const cluster = createCluster({ rootNodes: urls.map((u) => ({ url: u })) });
    cluster.on("error", (error: unknown) => {
      console.error("node-redis:", error);
    });
    await cluster.connect();
    return cluster;
  }
  const { Redis, Cluster } = await import("ioredis");
  if (urls.length === 1) return new Redis(first);
  return new Cluster(
    urls.map((u) => {
      const parsed = new URL(u);
      return { host: parsed.hostname, port: Number(parsed.port || 6379) };
    }),
  );
}

class Driver {
  private readonly leases = new Map<string, Held>();
  constructor(private readonly locks: Locks) {}

  private lease(name: string | undefined): Held {
    const lease = this.leases.get(name ?? "");
    if (lease === undefined) throw new ServerError("usage", `no lease named "${name ?? ""}"`);
    return lease;
  }

  /** Names lease and reports its loss the moment the client knows it. */
  private keep(name: string, lease: Held): void {
    this.leases.set(name, lease);
    lease.on("lost", (lost: LeaseLostError) => {
      write({ event: "lost", lease: name, reason: lost.reason });
    });
  }

  async handle(req: Request): Promise<unknown> {
    switch (req.op) {
      case "hold":
      case "wait":
      case "ticket":
      case "shared":
      case "semaphore":
        return this.hold(req);
      case "hold_all": {
        const lease = await this.locks.holdAll(req.resources ?? [], { ttl: req.ttl_ms ?? 30_000, wait: req.wait_ms ?? 0 });
        this.keep(req.lease ?? "", lease);
        return { fences: lease.fences, token: lease.token };
      }
      case "campaign": {
        const lease = await this.locks.campaign(req.name ?? "", req.address ?? "", {
          ttl: req.ttl_ms ?? 10_000,
          ...(req.wait_ms === undefined ? {} : { wait: req.wait_ms }),
        });
        this.keep(req.lease ?? "", lease);
        return { fence: lease.fence };
      }
      case "renew": {
        const lease = this.lease(req.lease);
        return { renewed: await lease.renew() };
      }
      case "release": {
        const lease = this.lease(req.lease);
        try {
          await lease.release();
          return { released: true };
        } catch (error) {
          if (error instanceof LeaseLostError) return { released: false };
          throw error;
        }
      }
      case "fenced": {
        const lease = this.lease(req.lease);
        const command = req.command ?? [];
        // A set's write goes under the fence of the member it names.
        if (lease instanceof SetLease) return { reply: encode(await lease.fenced(req.resource ?? "", command)) };
        if (lease instanceof Lease) return { reply: encode(await lease.fenced(command)) };
        throw new ServerError("usage", `"${req.lease ?? ""}" is neither a lease nor a set`);
      }
      case "run": {
        const lease = this.lease(req.lease);
        const { runUnder } = await import("./locks.js");
        await runUnder(lease, async (held) => {
          await sleep(req.work_ms ?? 0, undefined, { signal: held.signal }).catch(() => undefined);
          if (req.fail === true) throw new WorkError("the work failed");
          held.check();
        });
        return { output: "done" };
      }
      case "observe": {
        const name = req.name ?? "";
        (async () => {
          for await (const leader of this.locks.observe(name)) write({ event: "leader", name, leader });
        })().catch((error: unknown) => {
          console.error(`dlock-conformance-driver: observing "${name}" ended:`, error);
        });
        return {};
      }
      default:
        throw new ServerError("usage", `unknown op "${req.op ?? ""}"`);
    }
  }

  private async hold(req: Request): Promise<unknown> {
    let strategy = req.strategy ?? "block";
    let mode = req.mode ?? "exclusive";
    if (req.op === "wait") strategy = "block";
    if (req.op === "ticket") strategy = "tickets";
    if (req.op === "shared") mode = "shared";
    if (req.op === "semaphore") mode = "permits";
    if (strategy !== "block" && strategy !== "tickets") throw new ServerError("usage", `unknown strategy "${strategy}"`);
    const options: HoldOptions = {
      ttl: req.ttl_ms ?? 30_000,
      wait: req.wait_ms ?? 0,
      strategy,
      ...(req.ticket_ms === undefined ? {} : { ticket: req.ticket_ms }),
      ...(req.meta === undefined ? {} : { meta: req.meta }),
      ...(req.max_hold_ms === undefined ? {} : { maxHold: req.max_hold_ms }),
    };
    let lease: Lease;
    const resource = req.resource ?? "";
    if (mode === "exclusive") lease = await this.locks.hold(resource, options);
    else if (mode === "shared") lease = await this.locks.read(resource, options);
    else if (mode === "permits") lease = await this.locks.semaphore(resource, req.permits ?? 0, options);
    else throw new ServerError("usage", `unknown mode "${mode}"`);
    this.keep(req.lease ?? "", lease);
    return { fence: lease.fence, token: lease.token };
  }
}

async function main(): Promise<void> {
  let client: RedisLike;
  try {
    client = await connect(process.env["DLOCK_URL"] ?? "");
  } catch (error) {
    console.error("dlock-conformance-driver:", error);
    process.exit(2);
  }
  const driver = new Driver(new Locks(client));
  const redis = process.env.DLOCK_CLIENT === "node-redis" ? "node-redis" : "ioredis";
  write({ event: "ready", client: `@dlock/client ${VERSION} (${redis})` });
  const inFlight = new Set<Promise<void>>();
  const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const raw of lines) {
    const line = raw.trim();
    if (line === "") continue;
    let req: Request;
    try {
      req = JSON.parse(line) as Request;
    } catch (error) {
      console.error(`dlock-conformance-driver: not a request: ${line} (${String(error)})`);
      continue;
    }
    const id = req.id;
    if (typeof id !== "number") {
      console.error(`dlock-conformance-driver: no id: ${line}`);
      continue;
    }
    const served: Promise<void> = driver
      .handle(req)
      .then(
        (ok) => {
          write({ id, ok });
        },
        (error: unknown) => {
          write({ id, error: describe(error) });
        },
      )
      .catch((error: unknown) => {
        console.error(`dlock-conformance-driver: could not answer request ${String(id)}:`, error);
      });
    inFlight.add(served);
    void served.finally(() => inFlight.delete(served));
  }
  // stdin closed: the requests already read get their replies (at most the grace), then exit.
  await Promise.race([Promise.all(inFlight), sleep(CLOSING_GRACE)]);
  process.exit(0);
}

main().catch((error: unknown) => {
  console.error("dlock-conformance-driver:", error);
  process.exit(2);
});
