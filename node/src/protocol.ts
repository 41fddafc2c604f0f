// dlock's wire rules, written once for this client: channel names, the hand-over tag, channel
// messages, key slots, the argument vector of every command form, error classes and reading
// DLOCK.INFO. No I/O here. protocol/vectors/*.json pins every rule (test/protocol.test.ts loads
// them); docs/protocol.md is the contract in prose.

export const ACQUIRE = "DLOCK.ACQUIRE";
export const RENEW = "DLOCK.RENEW";
export const RELEASE = "DLOCK.RELEASE";
export const FENCECHECK = "DLOCK.FENCECHECK";
export const FENCED = "DLOCK.FENCED";
export const INFO = "DLOCK.INFO";
export const ACQUIREALL = "DLOCK.ACQUIREALL";
export const RENEWALL = "DLOCK.RENEWALL";
export const RELEASEALL = "DLOCK.RELEASEALL";

/** The most resources in one set (the server's bound on `numkeys`). */
export const MAX_SET = 64;

/** The server's bound on a semaphore's permits (SHARED LIMIT n). */
export const MAX_PERMITS = 1_000_000;

/** The option keywords of the version 2 commands. */
const OPTION_KEYWORDS = ["CLAIM", "FENCE", "LIMIT", "META", "NOTIFY", "QUEUE", "SHARED", "WAIT"];

/**
 * The channel where the server publishes a resource's changes of ownership: a resource with
 * braces keeps them, and its hash tag, behind `dlock:key:`; any other is wrapped in a tag, so the
 * channel lives in the key's slot and no two resources share one.
 */
export function channelName(resource: string): string {
  return /[{}]/.test(resource) ? `dlock:key:${resource}` : `dlock:{${resource}}`;
}

/** FNV-1a 32-bit of the token's UTF-8 bytes, as 8 lowercase hex digits: the hand-over tag. */
export function tokenTag(token: string): string {
  let tag = 0x811c9dc5;
  for (const byte of Buffer.from(token, "utf8")) {
    tag ^= byte;
    tag = Math.imul(tag, 0x01000193) >>> 0;
  }
  return tag.toString(16).padStart(8, "0");
}

/**
 * FNV-1a 64-bit of the token's UTF-8 bytes, as 16 lowercase hex digits: what a ticket's own
 * channel is named by (wide enough that two random tokens waiting at once never share it).
 */
export function wideTag(token: string): string {
  let tag = 0xcbf29ce484222325n;
  for (const byte of Buffer.from(token, "utf8")) {
    tag = ((tag ^ BigInt(byte)) * 0x100000001b3n) & 0xffffffffffffffffn;
  }
  return tag.toString(16).padStart(16, "0");
}

/**
 * The channel where the server tells the ticket of token on resource (sent with NOTIFY) alone of
 * its grant: the resource's channel, `:` and the token's wide tag
 * (`dlock:{invoice:123}:af63dc4c8601ec8c` for token `a`), in the resource's slot.
 */
export function ticketChannelName(resource: string, token: string): string {
  return `${channelName(resource)}:${wideTag(token)}`;
}

/**
 * Whether a channel message wakes a watcher with `tag` (`null`: an observer, woken by every
 * message). acquired, renewed, released and expired wake no ticket waiter; a handoff wakes the
 * token it names; a handoff without a tag (an older server) and any message this version does
 * not understand wake every waiter.
 */
export function wakes(message: string, tag: string | null): boolean {
  if (tag === null) return true;
  const words = message.split(" ");
  const event = words[0] ?? "";
  if (words.length === 2 && ["acquired", "renewed", "released", "expired"].includes(event)) {
    return false;
  }
  if (words.length === 3 && event === "handoff") return words[2] === tag;
  return true;
}

/** The largest fence a server mints (a u64), and the largest a message may name. */
const MAX_WIRE_FENCE = 2n ** 64n - 1n;

/** A `revoked <fence> [<reason>]` message read: an operator's DLOCK.REVOKE ended that lease. */
export interface Revocation {
  /**
   * The revoked lease's fence, read as this client reads every fence (a number): one beyond
   * 2^53 is not exact, and is never a lease's (see `revokes`).
   */
  fence: number;
  /** The rest of the message after the fence's space, as given to REVOKE; "" without one. */
  reason: string;
}

/**
 * The fence and reason of a `revoked` message, or null for any other message (the channel's
 * other events, a fence that is not a u64).
 */
export function revocationOf(message: string): Revocation | null {
  if (!message.startsWith("revoked ")) return null;
  const rest = message.slice("revoked ".length);
  const space = rest.indexOf(" ");
  const digits = space < 0 ? rest : rest.slice(0, space);
  if (!/^\+?\d+$/.test(digits) || BigInt(digits) > MAX_WIRE_FENCE) return null;
  return { fence: Number(digits), reason: space < 0 ? "" : rest.slice(space + 1) };
}

/**
 * Whether revocation ends the lease whose fence is fence. A fence read beyond 2^53 is rounded,
 * so it matches nothing: the server mints no such fence for a client that reads them as numbers.
 */
export function revokes(revocation: Revocation, fence: number): boolean {
  return Number.isSafeInteger(revocation.fence) && revocation.fence === fence;
}

/**
 * A `granted <fence> <request> <window-ms>` message on a ticket's own channel: the lease of
 * `fence` was handed to the ticket after the server read its ACQUIRE numbered `request`
 * (NOTIFY), and runs `windowMs` from the hand-over unless claimed. Read as this client reads
 * every number (fences included): beyond 2^53 not exact, and then never a lease's (see
 * `grantedExpiry`).
 */
export interface Granted {
  fence: number;
  request: number;
  windowMs: number;
}

/** The Granted of a `granted` message, or null for any other message. */
export function grantedOf(message: string): Granted | null {
  const words = message.split(" ");
  if (words.length !== 4 || words[0] !== "granted") return null;
  const numbers = words.slice(1);
  if (!numbers.every((word) => /^\d+$/.test(word) && BigInt(word) <= MAX_WIRE_FENCE)) return null;
  const [fence, request, windowMs] = numbers.map(Number);
  if (fence === undefined || request === undefined || windowMs === undefined) return null;
  return { fence, request, windowMs };
}

/**
 * The earliest the lease a `granted` message announces may end, on the clock of sentAt (each
 * ACQUIRE's send time by its NOTIFY number, taken before it was sent): the named request's send
 * time plus the window (that request reached the server before the hand-over). null when the
 * request is not one of the attempt's, or the fence is not exact (beyond 2^53).
 */
export function grantedExpiry(message: Granted, sentAt: ReadonlyMap<number, number>): number | null {
  if (!Number.isSafeInteger(message.fence) || !Number.isSafeInteger(message.request)) return null;
  const sent = sentAt.get(message.request);
  return sent === undefined ? null : sent + message.windowMs;
}

/** The Redis Cluster slot of a key: CRC16/XMODEM of its hash tag or of the whole key, mod 16384. */
export function keySlot(key: string): number {
  let bytes = Buffer.from(key, "utf8");
  const open = bytes.indexOf(0x7b);
  if (open >= 0) {
    const close = bytes.indexOf(0x7d, open + 1);
    if (close > open + 1) bytes = bytes.subarray(open + 1, close);
  }
  let crc = 0;
  for (const byte of bytes) {
    crc ^= byte << 8;
    for (let bit = 0; bit < 8; bit++) {
      crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
    }
  }
  return crc % 16384;
}

/** The kind of lease an acquire asks for. */
export interface Mode {
  shared: boolean;
  /** With `shared`: a semaphore of this many permits; 0 for a reader. */
  permits: number;
}

export const EXCLUSIVE: Mode = { shared: false, permits: 0 };

export function modeName(mode: Mode): "exclusive" | "shared" {
  return mode.shared ? "shared" : "exclusive";
}

/** One DLOCK.ACQUIRE as sent. Absent fields leave their option out. */
export interface AcquireForm {
  resource: string;
  token: string;
  ttlMs: number;
  mode?: Mode;
  /** 0: wait without limit. */
  waitMs?: number;
  queueMs?: number;
  /** With queueMs: the ticket is told of its grant on its own channel, naming this number. */
  notify?: number;
  claimMs?: number;
  meta?: string;
}

/**
 * `DLOCK.ACQUIRE resource token ttl-ms [SHARED [LIMIT n]] [WAIT ms | QUEUE ms [NOTIFY n]]
 * [CLAIM ms] [META value]`. CLAIM goes only with a wait or a ticket (a grant answered at once is
 * claimed by its answer) and never longer than the ttl; NOTIFY only with a ticket.
 */
export function acquireArgs(form: AcquireForm): string[] {
  const args = [ACQUIRE, form.resource, form.token, num(form.ttlMs)];
  if (form.mode?.shared) {
    args.push("SHARED");
    if (form.mode.permits > 0) args.push("LIMIT", num(form.mode.permits));
  }
  let waiting = false;
  if (form.queueMs !== undefined && form.queueMs > 0) {
    args.push("QUEUE", num(form.queueMs));
    if (form.notify !== undefined) args.push("NOTIFY", num(form.notify));
    waiting = true;
  } else if (form.waitMs !== undefined) {
    args.push("WAIT", num(form.waitMs));
    waiting = true;
  }
  if (waiting && form.claimMs !== undefined && form.claimMs > 0) {
    args.push("CLAIM", num(Math.min(form.claimMs, form.ttlMs)));
  }
  if (form.meta !== undefined) args.push("META", form.meta);
  return args;
}

/** `DLOCK.RENEW resource token ttl-ms [FENCE fence]` (no fence: a server without FENCE). */
export function renewArgs(resource: string, token: string, ttlMs: number, fence?: number): string[] {
  const args = [RENEW, resource, token, num(ttlMs)];
  if (fence !== undefined) args.push("FENCE", num(fence));
  return args;
}

/**
 * `DLOCK.RELEASE resource token [FENCE fence]`. Without a fence (an attempt whose outcome is
 * unknown) it frees that attempt's grant and takes its ticket out of line.
 */
export function releaseArgs(resource: string, token: string, fence?: number): string[] {
  const args = [RELEASE, resource, token];
  if (fence !== undefined) args.push("FENCE", num(fence));
  return args;
}

/** `name numkeys resource … token`: how every command of sets starts. */
function setArgs(name: string, resources: readonly string[], token: string): string[] {
  return [name, num(resources.length), ...resources, token];
}

/**
 * `DLOCK.ACQUIREALL numkeys resource … token ttl-ms [QUEUE ticket-ms] [META value]`: every
 * resource (exclusive) to one token, or none; with `queueMs`, a ticket in every member's line.
 */
export function acquireAllArgs(form: { resources: readonly string[]; token: string; ttlMs: number; queueMs?: number; meta?: string }): string[] {
  const args = [...setArgs(ACQUIREALL, form.resources, form.token), num(form.ttlMs)];
  if (form.queueMs !== undefined && form.queueMs > 0) args.push("QUEUE", num(form.queueMs));
  if (form.meta !== undefined) args.push("META", form.meta);
  return args;
}

/** `DLOCK.RENEWALL numkeys resource … token ttl-ms FENCES fence …`: every member, or none. */
export function renewAllArgs(resources: readonly string[], token: string, ttlMs: number, fences: readonly number[]): string[] {
  return [...setArgs(RENEWALL, resources, token), num(ttlMs), "FENCES", ...fences.map(num)];
}

/**
 * `DLOCK.RELEASEALL numkeys resource … token [FENCES fence …]`. Without fences (an attempt's)
 * it takes the set's tickets out of every line and frees what the token was granted.
 */
export function releaseAllArgs(resources: readonly string[], token: string, fences?: readonly number[]): string[] {
  const args = setArgs(RELEASEALL, resources, token);
  if (fences !== undefined) args.push("FENCES", ...fences.map(num));
  return args;
}

export function fenceCheckArgs(resource: string, fence: number): string[] {
  return [FENCECHECK, resource, num(fence)];
}

export function infoArgs(resource: string): string[] {
  return [INFO, resource];
}

/** `DLOCK.FENCED resource fence command [arg …]`. */
export function fencedArgs(resource: string, fence: number, command: readonly string[]): string[] {
  return [FENCED, resource, num(fence), ...command];
}

function num(n: number | bigint): string {
  return typeof n === "bigint" ? n.toString() : Math.trunc(n).toFixed(0);
}

/** Classes of server error replies (docs/protocol.md, section 9). */
export type ErrorClass =
  | "redirect"
  | "retry"
  | "failover"
  | "unblocked"
  | "stale"
  | "cross_slot"
  | "mode_conflict"
  | "unsupported"
  | "auth"
  | "wrong_type"
  | "usage"
  | "server";

const CLASS_BY_CODE: Record<string, ErrorClass> = {
  MOVED: "redirect",
  ASK: "redirect",
  TRYAGAIN: "retry",
  LOADING: "retry",
  CLUSTERDOWN: "retry",
  MASTERDOWN: "retry",
  READONLY: "failover",
  UNBLOCKED: "unblocked",
  STALE: "stale",
  CROSSSLOT: "cross_slot",
  LOCKMODE: "mode_conflict",
  NOAUTH: "auth",
  WRONGPASS: "auth",
  NOPERM: "auth",
  WRONGTYPE: "wrong_type",
};

const UNEXPECTED_ARGUMENT = "ERR syntax error: unexpected argument '";

/** The class of an error reply (its whole text, code first): what a client does next. */
export function errorClass(reply: string): ErrorClass {
  const code = reply.split(" ", 1)[0] ?? "";
  const known = CLASS_BY_CODE[code];
  if (known !== undefined) return known;
  if (code === "ERR") {
    if (unsupportedOption(reply) !== null) return "unsupported";
    if (reply.startsWith("ERR fence counter exhausted") || reply.startsWith("ERR internal error")) {
      return "server";
    }
    return "usage";
  }
  return "server";
}

/** The option keyword an older server refused as an unknown argument, upper case, or null. */
export function unsupportedOption(reply: string): string | null {
  if (!reply.startsWith(UNEXPECTED_ARGUMENT) || !reply.endsWith("'")) return null;
  const named = reply.slice(UNEXPECTED_ARGUMENT.length, -1).toUpperCase();
  return OPTION_KEYWORDS.includes(named) ? named : null;
}

/** The largest value a bounds error allows (`… between 0 and 86400000` → 86400000), or null. */
export function upperBound(reply: string): number | null {
  const at = reply.lastIndexOf(" between ");
  if (at < 0) return null;
  const rest = reply.slice(at + " between ".length);
  const and = rest.indexOf(" and ");
  if (and < 0) return null;
  const digits = rest.slice(and + " and ".length).split(" ", 1)[0] ?? "";
  return /^\d+$/.test(digits) ? Number(digits) : null;
}

/** A MOVED or ASK reply read: its kind, slot and address; null for any other reply. */
export function redirectOf(reply: string): { kind: "moved" | "ask"; slot: number; addr: string } | null {
  const words = reply.split(" ");
  if (words.length !== 3 || (words[0] !== "MOVED" && words[0] !== "ASK")) return null;
  const slot = Number(words[1]);
  if (!Number.isInteger(slot)) return null;
  return { kind: words[0] === "MOVED" ? "moved" : "ask", slot, addr: words[2] ?? "" };
}

/** One live shared lease in DLOCK.INFO's `leases`. */
export interface Holder {
  token: string;
  fence: number;
  ttlMs: number;
  meta: string | null;
}

/** What DLOCK.INFO shows, read by field name (fields of later versions change nothing). */
export interface Info {
  owner: string | null;
  fence: number | null;
  ttlMs: number;
  waiters: number;
  nextWaiters: string[];
  tickets: number;
  mode: string | null;
  holders: number;
  meta: string | null;
  leases: Holder[];
}

/**
 * Who leads an election: its candidate's address (the lease's META; null without one), the
 * term's fence (larger for every newer term) and the lease's token.
 */
export interface Leader {
  token: string;
  fence: number;
  address: string | null;
}

/**
 * Reads a DLOCK.INFO reply as the Redis clients return it: a flat list of names and values
 * (RESP2), a Map or a plain object (RESP3); null for nil (no lease, nobody waiting).
 */
export function parseInfo(reply: unknown): Info | null {
  if (reply === null || reply === undefined) return null;
  const fields = new Map<string, unknown>();
  if (reply instanceof Map) {
    for (const [name, value] of reply) fields.set(String(name), value);
  } else if (Array.isArray(reply)) {
    for (let i = 0; i + 1 < reply.length; i += 2) fields.set(String(reply[i]), reply[i + 1]);
  } else if (typeof reply === "object") {
    for (const [name, value] of Object.entries(reply)) fields.set(name, value);
  } else {
    throw new TypeError(`unexpected DLOCK.INFO reply ${JSON.stringify(reply)}`);
  }
  const list = (value: unknown): unknown[] => (Array.isArray(value) ? value : []);
  return {
    owner: text(fields.get("owner")),
    fence: integer(fields.get("fence")),
    ttlMs: integer(fields.get("ttl-ms")) ?? 0,
    waiters: integer(fields.get("waiters")) ?? 0,
    nextWaiters: list(fields.get("next-waiters")).flatMap((item) => {
      const token = text(item);
      return token === null ? [] : [token];
    }),
    tickets: integer(fields.get("tickets")) ?? 0,
    mode: text(fields.get("mode")),
    holders: integer(fields.get("holders")) ?? 0,
    meta: text(fields.get("meta")),
    leases: list(fields.get("leases")).flatMap((item) => {
      if (!Array.isArray(item) || item.length < 4) return [];
      return [
        {
          token: text(item[0]) ?? "",
          fence: integer(item[1]) ?? 0,
          ttlMs: integer(item[2]) ?? 0,
          meta: text(item[3]),
        },
      ];
    }),
  };
}

/**
 * The leader DLOCK.INFO shows: the holder of a live exclusive lease (a version 1 server shows no
 * mode, and its lease is exclusive), or null.
 */
export function leaderFromInfo(reply: unknown): Leader | null {
  const info = parseInfo(reply);
  if (info === null || info.owner === null || info.fence === null) return null;
  if (info.mode !== null && info.mode !== "exclusive") return null;
  return { token: info.owner, fence: info.fence, address: info.meta };
}

function text(value: unknown): string | null {
  if (typeof value === "string") return value;
  if (Buffer.isBuffer(value)) return value.toString("utf8");
  return null;
}

function integer(value: unknown): number | null {
  if (typeof value === "number") return value;
  if (typeof value === "bigint") return Number(value);
  if (typeof value === "string" && /^-?\d+$/.test(value)) return Number(value);
  return null;
}

/** An ACQUIRE reply read: a fence, or null for nil. */
export function fenceOf(reply: unknown): number | null {
  if (reply === null || reply === undefined) return null;
  const fence = integer(reply);
  if (fence === null || fence <= 0) throw new TypeError(`unexpected DLOCK.ACQUIRE reply ${JSON.stringify(reply)}`);
  return fence;
}

/** An ACQUIREALL reply read: the `count` fences in the order asked, or null for nil. */
export function fencesOf(reply: unknown, count: number): number[] | null {
  if (reply === null || reply === undefined) return null;
  if (Array.isArray(reply) && reply.length === count) {
    const fences = reply.map(integer);
    if (fences.every((fence): fence is number => fence !== null && fence > 0)) return fences;
  }
  throw new TypeError(`unexpected DLOCK.ACQUIREALL reply ${JSON.stringify(reply)} for ${String(count)} resources`);
}

/** A RELEASE or RELEASEALL reply read: how many leases it released. */
export function countOf(reply: unknown): number {
  return integer(reply) ?? 0;
}

/** A reply of RENEW, RELEASE or FENCECHECK read as 0 or 1. */
export function flagOf(reply: unknown): boolean {
  return integer(reply) === 1;
}
