// Locks takes leases through the caller's ioredis or node-redis client. It follows the client
// contract (docs/protocol.md): a token made before the first send and reused for ambiguous
// retries; a wait on a connection of its own whose timeouts are above the wait, always with a
// claim window; renewal with the grant's fence every ttl/3 against a conservative local expiry;
// a bounded release that never masks the work's own error; the release of an attempt's token
// when its outcome stayed unknown or the caller gave up. A set (holdAll) is one attempt over
// several resources: the same token, retries and release, its wait a ticket in every member's
// line.

import { randomBytes } from "node:crypto";
import { performance } from "node:perf_hooks";
import { setTimeout as sleepFor } from "node:timers/promises";

import { notSent, replyText, transportOf, type RedisLike, type Transport } from "./adapters.js";
import { Channels, firstWake, type Watch } from "./channels.js";
import {
  DlockError,
  InvalidArgumentError,
  NotAcquiredError,
  ServerError,
  StaleError,
  UnknownOutcomeError,
  UnreachableError,
} from "./errors.js";
import { Lease, SetLease, type Held } from "./lease.js";
import {
  claimMs,
  defaults,
  merge,
  millis,
  millisUp,
  releaseTimeout,
  type HoldOptions,
  type Options,
  type SetOptions,
  type Settings,
} from "./options.js";
import {
  ACQUIRE,
  EXCLUSIVE,
  MAX_PERMITS,
  MAX_SET,
  acquireAllArgs,
  acquireArgs,
  countOf,
  errorClass,
  fenceCheckArgs,
  fenceOf,
  fencedArgs,
  fencesOf,
  flagOf,
  grantedExpiry,
  infoArgs,
  leaderFromInfo,
  parseInfo,
  releaseAllArgs,
  releaseArgs,
  ticketChannelName,
  tokenTag,
  unsupportedOption,
  upperBound,
  type Granted,
  type Info,
  type Leader,
  type Mode,
} from "./protocol.js";

/** One server-side wait lasts at most this long when the caller waits without limit. */
const UNLIMITED_WAIT_SLICE = 3_600_000;
/** A WAIT answered nil earlier than this before the deadline was cut short, not timed out. */
const CUT_SHORT = 50;
const WAIT_AGAIN_PAUSE = 10;
/** Pauses between retries of an ambiguous failure: doubled after each, at most the maximum. */
const RETRY_PAUSE = 50;
const MAX_RETRY_PAUSE = 400;
/** The RELEASE of an attempt's token that found nothing is sent once more after this pause. */
const FORGET_AGAIN_AFTER = 100;
/** A set's ticket lives as long as its wait, at least this long … */
const SET_TICKET_MIN = 1_000;
/** … and at most this long (also a wait without limit's): a vanished waiter keeps no line longer. */
const SET_TICKET_MAX = 30_000;
/** A campaign waits in rounds of this length, each with a fresh token. */
const CAMPAIGN_ROUND = 30_000;
/** An observer reads DLOCK.INFO this often besides on every message. */
const OBSERVE_INTERVAL = 5_000;

/** A new token: 128 random bits as 32 hex digits. */
export function newToken(): string {
  return randomBytes(16).toString("hex");
}

/** Resolves after ms, or at once (false) when signal aborts. */
async function sleep(ms: number, signal?: AbortSignal): Promise<boolean> {
  if (signal?.aborted === true) return false;
  if (ms <= 0) return true;
  try {
    await sleepFor(ms, undefined, signal === undefined ? {} : { signal });
    return true;
  } catch {
    return false;
  }
}

/** Takes leases on the servers of an ioredis or node-redis client. */
export class Locks {
  private readonly transport: Transport;
  private readonly set: Settings;
  private readonly refused = new Set<string>();
  private channelsMade: Channels | null = null;

  /**
   * @param redis an ioredis `Redis` or `Cluster`, or a node-redis client or cluster (connected).
   * @param options the defaults of every call.
   */
  constructor(redis: RedisLike, options: Options = {}) {
    this.transport = transportOf(redis);
    this.set = defaults(options);
  }

  /**
   * Closes dlock's own subscribers and the connections of its fenced writes (the caller's client
   * stays open). Idle, they do not keep the process alive.
   */
  close(): void {
    this.channelsMade?.close();
    this.channelsMade = null;
    this.transport.close();
  }

  /** @internal */
  get channels(): Channels {
    this.channelsMade ??= new Channels(this.transport, this.set.requestTimeout);
    return this.channelsMade;
  }

  /** @internal */
  settings(options: HoldOptions = {}): Settings {
    return merge(this.set, options);
  }

  /**
   * An exclusive lease on resource, waiting in the server's queue up to `wait` (default 10 s) or
   * until `signal` aborts, renewed until release() or its loss. Rejects with NotAcquiredError,
   * UnreachableError, UnknownOutcomeError, ServerError or InvalidArgumentError.
   */
  hold(resource: string, options: HoldOptions = {}): Promise<Lease> {
    return this.acquire(resource, EXCLUSIVE, options);
  }

  /** The writer's side of a read-write lock: the same as hold. */
  write(resource: string, options: HoldOptions = {}): Promise<Lease> {
    return this.hold(resource, options);
  }

  /** The reader's side of a read-write lock: a shared lease, never held with a writer. */
  read(resource: string, options: HoldOptions = {}): Promise<Lease> {
    return this.acquire(resource, { shared: true, permits: 0 }, options);
  }

  /** One permit of the counting semaphore name (1 to 1 000 000 permits, the same for every user). */
  semaphore(name: string, permits: number, options: HoldOptions = {}): Promise<Lease> {
    if (!Number.isInteger(permits) || permits < 1 || permits > MAX_PERMITS) {
      return Promise.reject(
        new InvalidArgumentError(`permits must be an integer from 1 to ${String(MAX_PERMITS)}, not ${String(permits)}`),
      );
    }
    return this.acquire(name, { shared: true, permits }, options);
  }

  /**
   * Runs body under an exclusive lease on resource and releases it when body settles. Returns
   * body's result. Body's error is thrown as it is (a loss meanwhile is still logged, counted and
   * emitted); when body succeeded, a loss throws the LeaseLostError and a release that got no
   * answer NotReleasedError: a loss is never silent. The release waits at most the release
   * timeout.
   */
  async using<T>(resource: string, options: HoldOptions, body: (lease: Lease) => Promise<T>): Promise<T> {
    const lease = await this.hold(resource, options);
    return runUnder(lease, body);
  }

  /**
   * An exclusive lease on every one of resources for one token, each with a fence of its own, or
   * on none (DLOCK.ACQUIREALL): several things locked at once without ever holding part of them,
   * and without the deadlock of two callers locking them in different orders. 1 to 64
   * resources, each once (InvalidArgumentError before anything is sent); in Redis Cluster all in
   * one slot (a common hash tag), else ServerError cross_slot.
   *
   * A set that cannot be had at once waits up to `wait` (default 10 s; 0: one try; Infinity: no
   * limit) or until `signal` aborts, with a ticket in the line of every member (first come,
   * first served, single leases and sets alike), holding nothing meanwhile: subscribed to every
   * member's channel, it asks again on any message there and every third of its ticket (the
   * wait, from 1 s to 30 s). When the wait ends first, its tickets are withdrawn and it rejects
   * with NotAcquiredError. `strategy` and `ticket` are not read.
   *
   * The SetLease is one lease: renewed whole (DLOCK.RENEWALL with the fences) every ttl/3, lost
   * whole when a renewal is refused (a member expired, was deleted, released), when any
   * member's revocation is heard (revoked: the other members are then released), or at the
   * local expiry; released whole (DLOCK.RELEASEALL with the fences; a member already gone is the
   * loss `ended`). Rejects as hold does.
   */
  async holdAll(resources: readonly string[], options: SetOptions = {}): Promise<SetLease> {
    // Checked as the server would, before anything is sent (also for callers without types).
    const given: unknown = resources;
    if (!Array.isArray(given)) throw new InvalidArgumentError("holdAll takes an array of resources, not one resource");
    if (given.length < 1 || given.length > MAX_SET) {
      throw new InvalidArgumentError(`a set has 1 to ${String(MAX_SET)} resources, not ${String(given.length)}`);
    }
    const members: string[] = [];
    for (const resource of given as unknown[]) {
      if (typeof resource !== "string") throw new InvalidArgumentError(`a resource is a string, not ${String(resource)}`);
      if (members.includes(resource)) throw new InvalidArgumentError(`resource "${resource}" appears twice in the set`);
      members.push(resource);
    }
    const set = this.checked(options);
    const attempt = new SetAttempt(this, members, set, options.signal);
    return this.attempted(set, attempt.started, () => attempt.runSet());
  }

  /**
   * Runs body under a set of resources (holdAll) and releases it when body settles, with the
   * rules of `using`: body's result, or body's own error; a loss of the set throws its
   * LeaseLostError, a release that got no answer NotReleasedError.
   */
  async usingAll<T>(resources: readonly string[], options: SetOptions, body: (lease: SetLease) => Promise<T>): Promise<T> {
    const lease = await this.holdAll(resources, options);
    return runUnder(lease, body);
  }

  /**
   * Runs command in the server only while fence holds resource (DLOCK.FENCED), atomically, and
   * returns its reply. A stale fence rejects with StaleError: nothing ran. In Redis Cluster every
   * key of command must share the resource's slot (a hash tag), else ServerError cross_slot.
   * Sent at most once, on a connection of dlock's own that never sends a command again after a
   * reconnection (not on the caller's client, which would): a write whose reply was lost may
   * have run, and is never run twice. Such a failure rejects with the connection's error.
   */
  async fenced(resource: string, fence: number, command: readonly string[]): Promise<unknown> {
    try {
      return await this.transport.sendOnce(resource, fencedArgs(resource, fence, command), this.set.requestTimeout);
    } catch (error) {
      const text = replyText(error);
      if (text === null) throw error;
      if (errorClass(text) === "stale") {
        this.set.metrics.staleWrite?.();
        this.set.logger?.warn("dlock: stale operation rejected", { resource, fence, reason: text });
        throw new StaleError(resource, fence, text);
      }
      throw new ServerError(errorClass(text), text);
    }
  }

  /** Whether fence still holds resource on the server (DLOCK.FENCECHECK). */
  async fenceCheck(resource: string, fence: number): Promise<boolean> {
    return flagOf(await this.request(resource, fenceCheckArgs(resource, fence)));
  }

  /** DLOCK.INFO resource: null when there is no lease and nobody waits. */
  async info(resource: string): Promise<Info | null> {
    return parseInfo(await this.request(resource, infoArgs(resource)));
  }

  private async request(resource: string, args: string[]): Promise<unknown> {
    try {
      return await this.transport.send(resource, args, this.set.requestTimeout);
    } catch (error) {
      throw classified(error);
    }
  }

  /**
   * Waits until this candidate leads the election name, then returns the leadership as an
   * exclusive lease whose META is address; its fence is the term's epoch. Waits in rounds of 30 s,
   * each with a fresh token, until `signal` aborts (or `wait`, when given, passes). Default ttl
   * 10 s. Resign with lease.release().
   */
  async campaign(name: string, address: string, options: HoldOptions = {}): Promise<Lease> {
    const until = options.wait === undefined ? Infinity : performance.now() + options.wait;
    for (;;) {
      const round = Math.min(CAMPAIGN_ROUND, Math.max(0, until - performance.now()));
      try {
        return await this.acquire(name, EXCLUSIVE, { ttl: 10_000, ...options, wait: round, meta: address });
      } catch (error) {
        if (!(error instanceof NotAcquiredError) || options.signal?.aborted === true || performance.now() >= until) {
          throw error;
        }
      }
    }
  }

  /**
   * The leaders of the election name as they change: first the one leading now, then each new
   * one, null while nobody leads. Reads DLOCK.INFO on every message of the name's channel, every
   * (re)subscription and every 5 s. Ends when signal aborts or the loop breaks.
   */
  async *observe(name: string, options: { signal?: AbortSignal; interval?: number } = {}): AsyncGenerator<Leader | null> {
    const { signal } = options;
    const interval = options.interval ?? OBSERVE_INTERVAL;
    let watch = null;
    let first = true;
    let last: Leader | null = null;
    try {
      while (signal?.aborted !== true) {
        if (watch === null || watch.broken || watch.node !== this.transport.nodeOf(name)) {
          if (watch !== null) this.channels.leave(watch);
          watch = await this.channels.join(name, null);
        }
        watch.drain();
        let leader: Leader | null | undefined;
        try {
          leader = leaderFromInfo(await this.transport.send(name, infoArgs(name), this.set.requestTimeout));
        } catch {
          leader = undefined;
        }
        if (leader !== undefined && (first || !sameLeader(leader, last))) {
          first = false;
          last = leader;
          yield leader;
        }
        await watch.next(interval, signal);
      }
    } finally {
      if (watch !== null) this.channels.leave(watch);
    }
  }

  /**
   * @internal Sends the command build makes; an option an older server refused is dropped (and
   * the command sent again without it), except those of `own`: their refusal, marked, rejects
   * for the caller to act on first.
   */
  async call(resource: string, timeoutMs: number, build: () => string[], own: readonly string[] = []): Promise<unknown> {
    for (;;) {
      const args = build();
      try {
        return await this.transport.send(resource, args, timeoutMs);
      } catch (error) {
        if (!this.dropRefused(args, error)) throw error;
        if (own.includes(unsupportedOption(replyText(error) ?? "") ?? "")) throw error;
      }
    }
  }

  /** @internal Whether error refused an option of args that can be left out; marks it. */
  dropRefused(args: readonly string[], error: unknown): boolean {
    const option = unsupportedOption(replyText(error) ?? "");
    if (option === null || !["CLAIM", "META", "FENCE", "QUEUE", "NOTIFY"].includes(option)) return false;
    const key = `${args[0] ?? ""} ${option}`;
    if (this.refused.has(key)) return false;
    this.refused.add(key);
    return true;
  }

  /** @internal */
  isRefused(command: string, option: string): boolean {
    return this.refused.has(`${command} ${option}`);
  }

  /** @internal The fence to send, or undefined (no FENCE) for a server that refused it. */
  fenceArg(command: string, fence: number): number | undefined {
    return this.isRefused(command, "FENCE") ? undefined : fence;
  }

  /** @internal */
  get via(): Transport {
    return this.transport;
  }

  private async acquire(resource: string, mode: Mode, options: HoldOptions): Promise<Lease> {
    const set = this.checked(options);
    const attempt = new Attempt(this, resource, mode, set, options.signal);
    return this.attempted(set, attempt.started, () => attempt.run());
  }

  /** The settings of one acquire, its options checked before anything is sent. */
  private checked(options: HoldOptions): Settings {
    const set = this.settings(options);
    if (!(set.ttl >= 1)) throw new InvalidArgumentError(`ttl must be at least 1 ms, not ${String(set.ttl)}`);
    if (!(set.requestTimeout > 0)) throw new InvalidArgumentError(`requestTimeout must be positive, not ${String(set.requestTimeout)}`);
    if (!(set.wait >= 0)) throw new InvalidArgumentError(`wait must be 0 or more, not ${String(set.wait)}`);
    return set;
  }

  /** Runs attempt: counted, timed and logged as one acquire (a set's as one lease). */
  private async attempted<L extends Held>(set: Settings, started: number, run: () => Promise<L>): Promise<L> {
    set.metrics.acquireAttempt?.();
    try {
      const lease = await run();
      set.metrics.acquired?.((performance.now() - started) / 1000);
      set.logger?.info("dlock: lease acquired", { ...lease.logFields, mode: lease.mode });
      return lease;
    } catch (error) {
      set.metrics.acquireFailed?.(outcomeOf(error));
      throw error;
    }
  }
}

/** Runs body under lease (a set), then releases it, with `using`'s rules for errors. */
export async function runUnder<L extends Held, T>(lease: L, body: (lease: L) => Promise<T>): Promise<T> {
  let result: T;
  try {
    result = await body(lease);
  } catch (error) {
    await lease.settle();
    throw error;
  }
  const { lost, notReleased } = await lease.settle();
  if (lost !== null) throw lost;
  if (notReleased !== null) throw notReleased;
  return result;
}

function outcomeOf(error: unknown): string {
  if (error instanceof NotAcquiredError) return "held";
  if (error instanceof UnreachableError) return "unreachable";
  if (error instanceof UnknownOutcomeError) return "unknown";
  return "server";
}

/** A server's error reply as a ServerError with its class; other errors pass. */
function classified(error: unknown): unknown {
  const text = replyText(error);
  return text === null ? error : new ServerError(errorClass(text), text);
}

function sameLeader(a: Leader | null, b: Leader | null): boolean {
  if (a === null || b === null) return a === b;
  return a.fence === b.fence && a.token === b.token && a.address === b.address;
}

/** A failure the attempt may retry with the same token, or the error that ends it. */
type Failure = { retry: true } | { retry: false; error: unknown };

/** One acquire: its token, its deadline, and what it learned so far. */
class Attempt {
  readonly token = newToken();
  readonly started = performance.now();
  /** What its errors name: the resource, or a set's resources joined by ",". */
  protected readonly name: string;
  protected readonly ttl: number;
  protected readonly waitUntil: number;
  protected readonly holdEnd: number | null;
  private maxWait = 0;
  private reached = false;
  private answered = false;
  private failures = 0;
  private failingSince = 0;
  private lastError: unknown = undefined;

  constructor(
    protected readonly locks: Locks,
    /** The resource its requests are routed by (a set's first: all share its slot). */
    protected readonly resource: string,
    private readonly mode: Mode,
    protected readonly set: Settings,
    protected readonly signal: AbortSignal | undefined,
    name?: string,
  ) {
    this.name = name ?? resource;
    this.ttl = set.maxHold !== null ? Math.min(set.ttl, set.maxHold) : set.ttl;
    this.holdEnd = set.maxHold !== null ? this.started + set.maxHold : null;
    this.waitUntil = this.started + set.wait;
  }

  protected aborted(): boolean {
    return this.signal?.aborted === true;
  }

  protected left(): number {
    return this.waitUntil - performance.now();
  }

  private args(wait: { waitMs?: number; queueMs?: number; notify?: number }): string[] {
    const claim = this.locks.isRefused(ACQUIRE, "CLAIM")
      ? undefined
      : Math.max(claimMs(this.set), wait.queueMs ?? 0);
    return acquireArgs({
      resource: this.resource,
      token: this.token,
      ttlMs: millis(this.ttl),
      mode: this.mode,
      ...wait,
      ...(claim === undefined ? {} : { claimMs: claim }),
      ...(this.set.meta === null || this.locks.isRefused(ACQUIRE, "META") ? {} : { meta: this.set.meta }),
    });
  }

  private lease(fence: number, sent: number): Lease {
    return new Lease(this.locks, this.resource, this.token, fence, this.mode, millis(this.ttl), this.set, sent, this.holdEnd);
  }

  /**
   * The lease a ticket's own channel announced (granted), held from now on: its local expiry
   * the named request's send time plus the window, its claim (a RENEW with the fence, which
   * sets the full ttl) sent at once and not awaited, read by its first renewal. null (the next
   * ACQUIRE claims the turn instead) when the request is not one of this attempt's or less than
   * a request timeout of the window is left.
   */
  private startedLease(granted: Granted, sentAt: ReadonlyMap<number, number>): Lease | null {
    const expiry = grantedExpiry(granted, sentAt);
    const now = performance.now();
    if (expiry === null || expiry <= now + this.set.requestTimeout) return null;
    return new Lease(
      this.locks,
      this.resource,
      this.token,
      granted.fence,
      this.mode,
      millis(this.ttl),
      this.set,
      now,
      this.holdEnd,
      expiry,
    );
  }

  async run(): Promise<Lease> {
    if (this.set.strategy === "tickets" && !this.locks.isRefused(ACQUIRE, "QUEUE") && this.left() > 0) {
      const lease = await this.tickets();
      if (lease !== null) return lease;
    }
    return this.blocking();
  }

  /**
   * A plain ACQUIRE first; while time is left, an ACQUIRE … WAIT … CLAIM on a connection of its
   * own; after a grant from the queue, the same ACQUIRE without WAIT claims it.
   */
  private async blocking(): Promise<Lease> {
    let waitNext = false;
    for (;;) {
      if (this.aborted()) throw await this.giveUp(this.signal?.reason);
      const sent = performance.now();
      let waited = false;
      let reply: unknown;
      try {
        if (waitNext && this.left() > 0) {
          let wait = Math.min(this.left(), UNLIMITED_WAIT_SLICE);
          if (this.maxWait > 0) wait = Math.min(wait, this.maxWait);
          waited = true;
          const args = this.args({ waitMs: millisUp(wait) });
          try {
            reply = await this.blockingWait(millisUp(wait), args);
          } catch (error) {
            if (this.locks.dropRefused(args, error)) continue;
            // A redirect: the next plain ACQUIRE goes through the caller's client, which follows
            // it and refreshes its slot map.
            if (errorClass(replyText(error) ?? "") === "redirect") waitNext = false;
            throw error;
          }
        } else {
          reply = await this.locks.call(this.resource, this.set.requestTimeout, () => this.args({}));
        }
      } catch (error) {
        if (this.aborted()) throw await this.giveUp(this.signal?.reason);
        const failure = await this.failed(error);
        if (!failure.retry) throw failure.error;
        waitNext = waitNext && this.left() > 0;
        if (!(await sleep(this.retryPause(), this.signal))) throw await this.giveUp(this.signal?.reason);
        continue;
      }
      this.answer();
      let fence: number | null;
      try {
        fence = fenceOf(reply);
      } catch (error) {
        throw await this.serverFailure(error);
      }
      // The caller gave up: a grant now would be nobody's.
      if (this.aborted()) throw await this.giveUp(this.signal?.reason);
      if (fence !== null && !waited) return this.lease(fence, sent);
      if (fence !== null) {
        // Granted from the queue at some instant of the wait: claim it now (the same ACQUIRE
        // without WAIT answers the same fence and starts the full ttl).
        waitNext = false;
        continue;
      }
      // nil: held (or a claim whose window passed)
      if (this.left() <= (waited ? CUT_SHORT : 0)) {
        throw new NotAcquiredError(this.name, this.token);
      }
      if (waited && !(await sleep(Math.min(WAIT_AGAIN_PAUSE, this.left()), this.signal))) {
        throw await this.giveUp(this.signal?.reason);
      }
      waitNext = true;
    }
  }

  /**
   * One WAIT on a connection of its own whose timeouts are above the wait. When the caller's
   * signal aborts, the connection is closed (the server drops the waiter with it).
   */
  private async blockingWait(waitMs: number, args: string[]): Promise<unknown> {
    const timeout = waitMs + this.set.requestTimeout;
    const connection = await this.locks.via.open(this.resource, this.set.requestTimeout, timeout);
    // From here a request may reach the server.
    const onAbort = (): void => {
      connection.close();
    };
    this.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      this.reached = true;
      return await connection.send(args, timeout);
    } finally {
      this.signal?.removeEventListener("abort", onAbort);
      connection.close();
    }
  }

  /**
   * Tickets: each ACQUIRE … QUEUE numbered by NOTIFY (its send time kept, taken before it goes),
   * the ticket subscribed to its own channel before the first, where the server tells it alone
   * of its grant (`granted <fence> <request> <window-ms>`). The lease starts on that message: it
   * runs at least until the named request's send time plus the window (that request reached the
   * server before the hand-over), and its claim, a RENEW with the fence, goes out at once
   * without holding the caller back (the lease's first renewal reads its answer). With too
   * little of the window left, or an unknown request, the message only wakes the ticket, whose
   * next ACQUIRE claims the turn. A server without NOTIFY is waited on through the resource's
   * channel instead (subscribed before the next ACQUIRE, which goes without NOTIFY): the
   * ACQUIRE is sent again on a hand-over to this token. Either way the ACQUIRE goes again on
   * every (re)subscription and every ticket/3. null: the server has no QUEUE (the blocking
   * wait takes over).
   */
  private async tickets(): Promise<Lease | null> {
    const channels = this.locks.channels;
    let watch = null;
    let queued = false;
    let notifying = !this.locks.isRefused(ACQUIRE, "NOTIFY");
    // The send time of each ACQUIRE, by its NOTIFY number (from 1).
    const sentAt = new Map<number, number>();
    try {
      for (;;) {
        if (this.aborted()) throw await this.withdraw(queued, this.signal?.reason);
        if (queued && this.left() <= 0) throw await this.withdraw(queued, undefined);
        const serving = this.locks.via.nodeOf(this.resource);
        if (watch === null || watch.broken || watch.node !== serving) {
          // Subscribed before the first ticket, and again where the resource moved (or where
          // the subscription failed).
          if (watch !== null) channels.leave(watch);
          watch = notifying
            ? await channels.join(this.resource, null, ticketChannelName(this.resource, this.token))
            : await channels.join(this.resource, tokenTag(this.token));
        }
        watch.drain();
        const sent = performance.now();
        queued = true;
        let reply: unknown;
        try {
          reply = await this.locks.call(
            this.resource,
            this.set.requestTimeout,
            () => {
              if (!notifying) return this.args({ queueMs: millis(this.set.ticket) });
              const notify = sentAt.size + 1;
              sentAt.set(notify, performance.now());
              return this.args({ queueMs: millis(this.set.ticket), notify });
            },
            ["NOTIFY"],
          );
        } catch (error) {
          if (this.locks.isRefused(ACQUIRE, "QUEUE")) return null;
          if (notifying && unsupportedOption(replyText(error) ?? "") === "NOTIFY") {
            // An older server (or, after a failover, an older replica): the resource's channel,
            // subscribed before the next ACQUIRE, which goes without NOTIFY.
            notifying = false;
            channels.leave(watch);
            watch = null;
            continue;
          }
          const failure = await this.failed(error);
          if (!failure.retry) throw failure.error;
          if (!(await sleep(this.retryPause(), this.signal))) throw await this.withdraw(queued, this.signal?.reason);
          continue;
        }
        this.answer();
        let fence: number | null;
        try {
          fence = fenceOf(reply);
        } catch (error) {
          throw await this.serverFailure(error);
        }
        if (fence !== null) {
          if (this.aborted()) throw await this.giveUp(this.signal?.reason);
          return this.lease(fence, sent);
        }
        await watch.next(Math.max(0, Math.min(this.set.ticket / 3, this.left())), this.signal);
        // Told on its own channel: held from the message on, claimed beside the caller's work.
        const granted = watch.granted;
        watch.granted = null;
        if (notifying && granted !== null && !this.aborted()) {
          const lease = this.startedLease(granted, sentAt);
          if (lease !== null) return lease;
        }
      }
    } finally {
      if (watch !== null) channels.leave(watch);
    }
  }

  /** At the deadline a RELEASE without FENCE takes the ticket out of line or frees a grant. */
  protected async withdraw(queued: boolean, cause: unknown): Promise<Error> {
    if (queued) await this.forget();
    return new NotAcquiredError(this.name, this.token, cause);
  }

  /** Classifies a failed request: retry with the same token until the deadline, or the end. */
  protected async failed(error: unknown): Promise<Failure> {
    this.lastError = error;
    this.answered = false;
    const text = replyText(error);
    if (text !== null) {
      const bound = upperBound(text);
      if (bound !== null && bound > 0 && this.maxWait === 0 && text.startsWith("ERR timeout-ms ")) {
        // A wait longer than the server allows: wait in slices of its longest.
        this.maxWait = bound;
        return { retry: true };
      }
      const errorClassOf = errorClass(text);
      if (errorClassOf === "unblocked") this.reached = true;
      else if (!["redirect", "retry", "failover"].includes(errorClassOf)) {
        return { retry: false, error: await this.serverFailure(error) };
      }
    } else if (!notSent(error)) {
      this.reached = true;
    }
    this.failures++;
    const now = performance.now();
    if (this.failures === 1) this.failingSince = now;
    const limit = Number.isFinite(this.waitUntil)
      ? now >= this.waitUntil + this.set.requestTimeout
      : now - this.failingSince >= Math.max(5 * this.set.requestTimeout, 1000);
    if (limit) return { retry: false, error: await this.unsettled() };
    return { retry: true };
  }

  /** A reply came: the server had the request (a grant the caller no longer wants is released). */
  protected answer(): void {
    this.answered = true;
    this.reached = true;
    this.failures = 0;
  }

  protected retryPause(): number {
    const pause = RETRY_PAUSE * 2 ** Math.min(Math.max(this.failures - 1, 0), 8);
    return Math.max(RETRY_PAUSE, Math.min(pause, MAX_RETRY_PAUSE, Math.max(this.left(), 0)));
  }

  /** The retries ran out: unreachable if nothing could have arrived, else unknown (released). */
  private async unsettled(): Promise<Error> {
    if (!this.reached) return new UnreachableError(this.name, this.token, this.lastError);
    const released = await this.forget();
    return new UnknownOutcomeError(this.name, this.token, released, this.lastError);
  }

  /**
   * The caller's signal ended the attempt: whatever may have been granted to the token is
   * released (a wait is ended by closing its connection, so an unanswered request there is
   * the caller's doing, not an unknown outcome). Unreachable if nothing could have arrived.
   */
  private async giveUp(cause: unknown): Promise<Error> {
    if (!this.reached) return new UnreachableError(this.name, this.token, cause);
    await this.forget();
    return new NotAcquiredError(this.name, this.token, cause);
  }

  protected async serverFailure(error: unknown): Promise<Error> {
    if (this.reached) await this.forget();
    const failure = classified(error);
    return failure instanceof DlockError ? failure : new ServerError("server", String(failure));
  }

  /**
   * The RELEASE of the attempt's token (no FENCE: the fence is unknown; the token is this
   * attempt's alone): it frees a grant and takes a ticket out of line.
   */
  protected forgetArgs(): string[] {
    return releaseArgs(this.resource, this.token);
  }

  /**
   * Releases the attempt's token (forgetArgs) from a connection opened for it, once more after
   * 100 ms if the first found nothing. True if a grant (or ticket) was found and freed.
   */
  protected async forget(): Promise<boolean> {
    const timeout = releaseTimeout(this.set);
    for (let tries = 0; tries < 2; tries++) {
      if (tries > 0) await sleep(FORGET_AGAIN_AFTER);
      try {
        const connection = await this.locks.via.open(this.resource, timeout, timeout);
        try {
          if (countOf(await connection.send(this.forgetArgs(), timeout)) > 0) return true;
        } finally {
          connection.close();
        }
      } catch (error) {
        this.set.logger?.debug?.("dlock: could not release an unknown grant", { resource: this.resource, error: String(error) });
        return false;
      }
    }
    return false;
  }
}

/**
 * One acquire of a set (holdAll): DLOCK.ACQUIREALL by one token until it answers fences, with the
 * retries, deadline and release of Attempt. With a wait, every call carries QUEUE (the first
 * takes a ticket in every member's line, the later ones refresh it and are granted once the set
 * heads every line), sent again on any message of any member's channel (subscribed before the
 * first call) and every third of the ticket; when the wait ends, RELEASEALL without FENCES
 * withdraws the tickets (and frees a grant whose reply was lost).
 */
class SetAttempt extends Attempt {
  constructor(
    locks: Locks,
    private readonly resources: readonly string[],
    set: Settings,
    signal: AbortSignal | undefined,
  ) {
    super(locks, resources[0] ?? "", EXCLUSIVE, set, signal, resources.join(","));
  }

  protected override forgetArgs(): string[] {
    return releaseAllArgs(this.resources, this.token);
  }

  /** The ticket's life: the wait, from 1 s to 30 s (30 s without limit); none without a wait. */
  private ticket(): number | undefined {
    if (!(this.set.wait > 0)) return undefined;
    return Math.min(SET_TICKET_MAX, Math.max(SET_TICKET_MIN, this.set.wait));
  }

  async runSet(): Promise<SetLease> {
    const channels = this.locks.channels;
    const ticket = this.ticket();
    const args = acquireAllArgs({
      resources: this.resources,
      token: this.token,
      ttlMs: millis(this.ttl),
      ...(ticket === undefined ? {} : { queueMs: millis(ticket) }),
      ...(this.set.meta === null ? {} : { meta: this.set.meta }),
    });
    const watches: (Watch | null)[] = this.resources.map(() => null);
    // A ticket stands in line; a request went out (it may have been granted, or queued).
    let queued = false;
    let asked = false;
    try {
      for (;;) {
        if (this.aborted()) throw await this.withdraw(asked, this.signal?.reason);
        if (queued && this.left() <= 0) throw await this.withdraw(queued, undefined);
        if (ticket !== undefined) {
          // Subscribed to every member's channel before the first ticket, and again where a
          // subscription failed or the set's slot moved. Any message there may be the one that
          // frees the set (no handoff names a set's ticket): every message wakes it.
          for (const [index, resource] of this.resources.entries()) {
            const watch = watches[index] ?? null;
            if (watch !== null && !watch.broken && watch.node === this.locks.via.nodeOf(resource)) continue;
            if (watch !== null) channels.leave(watch);
            watches[index] = await channels.join(resource, null);
          }
          for (const watch of watches) watch?.drain();
          queued = true;
        }
        const sent = performance.now();
        asked = true;
        let reply: unknown;
        try {
          reply = await this.locks.call(this.resource, this.set.requestTimeout, () => args);
        } catch (error) {
          // The caller gave up with a request out: whatever it was granted is released.
          if (this.aborted()) throw await this.withdraw(true, this.signal?.reason);
          const failure = await this.failed(error);
          if (!failure.retry) throw failure.error;
          if (!(await sleep(this.retryPause(), this.signal))) throw await this.withdraw(true, this.signal?.reason);
          continue;
        }
        this.answer();
        let fences: number[] | null;
        try {
          fences = fencesOf(reply, this.resources.length);
        } catch (error) {
          throw await this.serverFailure(error);
        }
        if (fences !== null) {
          // The caller gave up meanwhile: the grant is nobody's, released at once.
          if (this.aborted()) throw await this.withdraw(true, this.signal?.reason);
          return new SetLease(
            this.locks,
            { resources: this.resources, fences },
            this.token,
            millis(this.ttl),
            this.set,
            sent,
            this.holdEnd,
          );
        }
        if (ticket === undefined) throw new NotAcquiredError(this.name, this.token);
        // In line: until a message on a member's channel, the ticket's refresh, or the deadline.
        await firstWake(
          watches.filter((watch): watch is Watch => watch !== null),
          Math.max(0, Math.min(ticket / 3, this.left())),
          this.signal,
        );
      }
    } finally {
      for (const watch of watches) if (watch !== null) channels.leave(watch);
    }
  }
}
