// The rules of src/protocol.ts against the shared vectors in protocol/vectors/, the same files
// every dlock client's tests load.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import * as protocol from "../src/protocol.js";
import { repoRoot } from "./kit.js";

// eslint-disable-next-line @typescript-eslint/no-unnecessary-type-parameters -- the vectors file's shape is the caller's
function vectors<T>(name: string): T {
  return JSON.parse(readFileSync(join(repoRoot, "protocol", "vectors", name), "utf8")) as T;
}

test("channel names", () => {
  for (const v of vectors<{ resource: string; channel: string }[]>("channels.json")) {
    assert.equal(protocol.channelName(v.resource), v.channel, v.resource);
  }
});

test("hand-over tags", () => {
  for (const v of vectors<{ token: string; tag: string }[]>("tags.json")) {
    assert.equal(protocol.tokenTag(v.token), v.tag, v.token);
  }
});

test("which channel messages wake whom", () => {
  const { wakes } = vectors<{ wakes: { message: string; tag: string | null; wakes: boolean }[] }>("messages.json");
  for (const v of wakes) assert.equal(protocol.wakes(v.message, v.tag), v.wakes, `${v.message} / ${String(v.tag)}`);
});

test("revoked messages: the fence and the reason, or not a revocation", () => {
  // Fences up to 2^64 − 1: kept as their digits (JSON.parse would round them) and compared exactly.
  const text = readFileSync(join(repoRoot, "protocol", "vectors", "messages.json"), "utf8").replace(/("fence":\s*)(\d+)/g, '$1"$2"');
  const { revoked } = JSON.parse(text) as { revoked: { message: string; fence: string | null; reason?: string }[] };
  assert.ok(revoked.some((v) => v.fence !== null && !Number.isSafeInteger(Number(v.fence))), "a fence beyond 2^53 among the vectors");
  for (const v of revoked) {
    const parsed = protocol.revocationOf(v.message);
    if (v.fence === null) {
      assert.equal(parsed, null, v.message);
      continue;
    }
    assert.ok(parsed !== null, v.message);
    assert.equal(parsed.reason, v.reason, v.message);
    // Read as every fence is (a number); exact up to 2^53, where it revokes its own fence only.
    assert.equal(parsed.fence, Number(v.fence), v.message);
    const exact = BigInt(v.fence) <= BigInt(Number.MAX_SAFE_INTEGER);
    if (exact) assert.equal(BigInt(parsed.fence), BigInt(v.fence), v.message);
    assert.equal(protocol.revokes(parsed, Number(v.fence)), exact, v.message);
    assert.equal(protocol.revokes(parsed, Number(v.fence) - 1), false, v.message);
  }
  // Beyond a u64 nothing is a fence; just beyond 2^53 the rounded fence matches nothing.
  assert.equal(protocol.revocationOf("revoked 18446744073709551616"), null);
  const rounded = protocol.revocationOf("revoked 9007199254740993 x");
  assert.ok(rounded !== null);
  assert.equal(protocol.revokes(rounded, 9007199254740992), false);
  assert.equal(protocol.revokes(rounded, Number.MAX_SAFE_INTEGER), false);
});

test("key slots", () => {
  for (const v of vectors<{ key: string; slot: number }[]>("slots.json")) {
    assert.equal(protocol.keySlot(v.key), v.slot, v.key);
  }
});

interface CommandVector {
  name: string;
  form: string;
  resource: string;
  token?: string;
  ttl_ms?: number;
  mode?: string;
  permits?: number;
  wait_ms?: number;
  queue_ms?: number;
  notify?: number;
  claim_ms?: number;
  meta?: string;
  fence?: number;
  inner?: string[];
  args: string[];
}

test("every command form's argument vector", () => {
  const all = vectors<CommandVector[]>("commands.json");
  assert.ok(all.length > 20);
  checkCommands(all);
});

function checkCommands(all: CommandVector[]): void {
  for (const v of all) {
    let args: string[];
    switch (v.form) {
      case "acquire": {
        const mode: protocol.Mode =
          v.mode === "shared" || v.mode === "permits" ? { shared: true, permits: v.permits ?? 0 } : protocol.EXCLUSIVE;
        args = protocol.acquireArgs({
          resource: v.resource,
          token: v.token ?? "",
          ttlMs: v.ttl_ms ?? 0,
          mode,
          ...(v.wait_ms === undefined ? {} : { waitMs: v.wait_ms }),
          ...(v.queue_ms === undefined ? {} : { queueMs: v.queue_ms }),
          ...(v.notify === undefined ? {} : { notify: v.notify }),
          ...(v.claim_ms === undefined ? {} : { claimMs: v.claim_ms }),
          ...(v.meta === undefined ? {} : { meta: v.meta }),
        });
        break;
      }
      case "renew":
        args = protocol.renewArgs(v.resource, v.token ?? "", v.ttl_ms ?? 0, v.fence);
        break;
      case "release":
        args = protocol.releaseArgs(v.resource, v.token ?? "", v.fence);
        break;
      case "fencecheck":
        args = protocol.fenceCheckArgs(v.resource, v.fence ?? 0);
        break;
      case "fenced":
        args = protocol.fencedArgs(v.resource, v.fence ?? 0, v.inner ?? []);
        break;
      case "info":
        args = protocol.infoArgs(v.resource);
        break;
      default:
        assert.fail(`unknown form ${v.form}`);
    }
    assert.deepEqual(args, v.args, v.name);
  }
}

interface ErrorVector {
  reply: string;
  class: string;
  option?: string;
  bound?: number;
}

test("every error reply's class, refused option and bound", () => {
  checkErrors(vectors<ErrorVector[]>("errors.json"));
});

function checkErrors(all: ErrorVector[]): void {
  for (const v of all) {
    assert.equal(protocol.errorClass(v.reply), v.class, v.reply);
    if (v.class === "unsupported") assert.equal(protocol.unsupportedOption(v.reply), v.option, v.reply);
    if (v.bound !== undefined) assert.equal(protocol.upperBound(v.reply), v.bound, v.reply);
  }
}

interface NotifyVectors {
  tags: { token: string; wide_tag: string }[];
  channels: { resource: string; token: string; channel: string }[];
  granted: { message: string; fence: string | null; request?: string; window_ms?: string }[];
  commands: CommandVector[];
  errors: ErrorVector[];
  expiry: { sent_ms: Record<string, number>; message: string; expiry_ms: number | null }[];
}

test("tickets told on their own channel: wide tags, channels, granted messages, NOTIFY, its errors, the expiry", () => {
  // The granted numbers go up to 2^64 − 1: kept as their digits (JSON.parse would round them).
  const text = readFileSync(join(repoRoot, "protocol", "vectors", "notify.json"), "utf8").replace(
    /("(?:fence|request|window_ms)":\s*)(\d+)/g,
    '$1"$2"',
  );
  const all = JSON.parse(text) as NotifyVectors;
  const sections = ["tags", "channels", "granted", "commands", "errors", "expiry"];
  assert.deepEqual(Object.keys(all).sort(), [...sections].sort(), "every section is checked");
  for (const section of sections) assert.ok((all[section as keyof NotifyVectors] as unknown[]).length > 0, section);
  for (const v of all.tags) assert.equal(protocol.wideTag(v.token), v.wide_tag, v.token);
  for (const v of all.channels) {
    assert.equal(protocol.ticketChannelName(v.resource, v.token), v.channel, `${v.resource} / ${v.token}`);
  }
  for (const v of all.granted) {
    const parsed = protocol.grantedOf(v.message);
    if (v.fence === null) {
      assert.equal(parsed, null, v.message);
      continue;
    }
    // Read as every number of this client is: exact up to 2^53.
    assert.deepEqual(parsed, { fence: Number(v.fence), request: Number(v.request), windowMs: Number(v.window_ms) }, v.message);
  }
  checkCommands(all.commands);
  checkErrors(all.errors);
  for (const v of all.expiry) {
    const message = protocol.grantedOf(v.message);
    assert.ok(message !== null, v.message);
    const sentAt = new Map(Object.entries(v.sent_ms).map(([request, ms]) => [Number(request), ms]));
    assert.equal(protocol.grantedExpiry(message, sentAt), v.expiry_ms, v.message);
  }
  // A fence beyond 2^53 (rounded) starts no lease.
  const rounded = protocol.grantedOf("granted 9007199254740993 1 6000");
  assert.ok(rounded !== null);
  assert.equal(protocol.grantedExpiry(rounded, new Map([[1, 1000]])), null);
});

/** A reply of replies.json as the Redis clients hand it over: maps as Map, statuses as text. */
function decode(reply: unknown): unknown {
  if (Array.isArray(reply)) return reply.map(decode);
  if (reply !== null && typeof reply === "object") {
    const shape = reply as { map?: [unknown, unknown][]; simple?: string };
    if (shape.map !== undefined) return new Map(shape.map.map(([k, v]) => [decode(k), decode(v)]));
    if (shape.simple !== undefined) return shape.simple;
  }
  return reply;
}

interface InfoVector {
  name: string;
  resp: number;
  reply: unknown;
  info: Record<string, unknown> | null;
  leader: protocol.Leader | null;
}

test("DLOCK.INFO replies in RESP2 and RESP3, and the leader they show", () => {
  const { info } = vectors<{ info: InfoVector[] }>("replies.json");
  for (const v of info) {
    const parsed = protocol.parseInfo(decode(v.reply));
    if (v.info === null) {
      assert.equal(parsed, null, v.name);
    } else {
      assert.ok(parsed !== null, v.name);
      assert.deepEqual(
        {
          owner: parsed.owner,
          fence: parsed.fence,
          ttl_ms: parsed.ttlMs,
          waiters: parsed.waiters,
          next_waiters: parsed.nextWaiters,
          tickets: parsed.tickets,
          mode: parsed.mode,
          holders: parsed.holders,
          meta: parsed.meta,
          leases: parsed.leases.map((l) => ({ token: l.token, fence: l.fence, ttl_ms: l.ttlMs, meta: l.meta })),
        },
        Object.fromEntries(Object.entries(v.info).filter(([k]) => !["leases"].includes(k)).concat([["leases", (v.info["leases"] ?? []) as unknown]])),
        `${v.name} (RESP${String(v.resp)})`,
      );
    }
    assert.deepEqual(protocol.leaderFromInfo(decode(v.reply)), v.leader, `${v.name} (RESP${String(v.resp)})`);
  }
});

test("DLOCK.FENCED replies: the inner reply or an error class", () => {
  const { fenced } = vectors<{ fenced: { name: string; reply: unknown; class: string | null }[] }>("replies.json");
  for (const v of fenced) {
    const reply = v.reply as { error?: string } | null;
    const cls = reply !== null && typeof reply === "object" && "error" in reply ? protocol.errorClass(reply.error ?? "") : null;
    assert.equal(cls, v.class, v.name);
  }
});

test("ACQUIRE, RENEW and RELEASE replies", () => {
  const { simple } = vectors<{ simple: { name: string; command: string; reply: unknown; value: unknown }[] }>("replies.json");
  for (const v of simple) {
    if (v.command === "acquire") assert.equal(protocol.fenceOf(v.reply), v.value, v.name);
    else if (typeof v.value === "boolean") assert.equal(protocol.flagOf(v.reply), v.value, v.name);
  }
});
