// A granted lease: its token owns the resource with `fence` until the server's deadline, kept
// alive by renewals (every ttl/3, with FENCE) until release() or the loss. The renewer is a timer
// of this lease: it lives and dies with it. At the local expiry without an answered renewal the
// lease is lost: unreachable when the last RENEW sent got no answer, stalled when none was
// awaiting one (the event loop did not run in time: a renewal found due after the expiry is
// never sent). While held, the lease listens on its resource's channel: an operator's
// DLOCK.REVOKE of its fence ends it there and then (revoked).
//
// A set (Locks.holdAll: DLOCK.ACQUIREALL) lives the same life as one lease, by the same code:
// its members are renewed together (DLOCK.RENEWALL … FENCES), a refused renewal or the
// revocation of any member loses the whole set (then the members still held are released), and
// the release is DLOCK.RELEASEALL … FENCES, which must release every member (fewer: `ended`).

import { EventEmitter } from "node:events";
import { performance } from "node:perf_hooks";

import type { Watch } from "./channels.js";
import { InvalidArgumentError, LeaseLostError, NotReleasedError, type LossReason, type Members } from "./errors.js";
import type { Locks } from "./locks.js";
import {
  countOf,
  flagOf,
  modeName,
  releaseAllArgs,
  releaseArgs,
  renewAllArgs,
  renewArgs,
  revocationOf,
  revokes,
  RELEASE,
  RENEW,
  type Mode,
} from "./protocol.js";
import { millis, releaseTimeout, type Settings } from "./options.js";

/** A lease cut to end with maxHold ends up to this much before it (ms round down). */
const MAX_HOLD_ROUNDING = 2;

/** How a release ended, for `using` and dispose: nothing is thrown from here. */
export interface Settled {
  lost: LeaseLostError | null;
  notReleased: NotReleasedError | null;
}

/**
 * What Lease and SetLease share: the token, the ttl, the renewals, the loss and the release.
 * `signal` is aborted (with the LeaseLostError as its reason) the moment the lease is known lost;
 * `check()` throws it. Events: `lost` (LeaseLostError), `renewed` (the new local expiry, ms on
 * performance.now()), `error` (a failed renewal or release, the best-effort RELEASE after a loss
 * included; emitted only when someone listens).
 */
export abstract class Held extends EventEmitter {
  /** The owner token: random, made before the first ACQUIRE, secret to the holder. */
  readonly token: string;
  /** "exclusive" (hold, write, campaign, holdAll) or "shared" (read, semaphore). */
  readonly mode: "exclusive" | "shared";
  /** The lease's length in ms; renewed every third of it. */
  readonly ttl: number;

  /** @internal Every member (one for a Lease), in the order asked, each with its fence. */
  protected readonly members: Members;
  /** @internal A set: renewed and released with the commands of sets, released after a revocation. */
  private readonly whole: boolean;
  private readonly controller = new AbortController();
  private readonly granted = performance.now();
  private localExpiry: number;
  private nextRenewal: number;
  private timer: NodeJS.Timeout | null = null;
  private lostError: LeaseLostError | null = null;
  private releasing: Promise<Settled> | null = null;
  private renewing: Promise<boolean> | null = null;
  /** The last RENEW sent has no answer yet, or got none (failed, timed out). */
  private unanswered = false;
  /** One per member, listening on its channel. */
  private watches: (Watch | null)[];
  private finished = false;
  /**
   * A lease started on its ticket's `granted` message: its claim (a RENEW with the fence, sent
   * at the grant), whose answer the first renewal reads instead of sending its own.
   */
  private claim: Promise<boolean> | null = null;

  /** @internal */
  constructor(
    private readonly locks: Locks,
    members: Members,
    whole: boolean,
    token: string,
    mode: Mode,
    ttl: number,
    private readonly set: Settings,
    sent: number,
    private readonly holdEnd: number | null,
    started?: number,
  ) {
    super();
    this.members = { resources: [...members.resources], fences: [...members.fences] };
    this.whole = whole;
    this.token = token;
    this.mode = modeName(mode);
    this.ttl = ttl;
    this.localExpiry = sent + ttl;
    this.nextRenewal = sent + ttl / 3;
    this.watches = members.resources.map(() => null);
    if (started !== undefined) {
      // Started on its ticket's message: held until the local expiry the message gives, its
      // claim sent now (not awaited: the work starts meanwhile) and read by the first renewal,
      // due at once (and by renew() while it is out).
      this.localExpiry = started;
      this.nextRenewal = performance.now();
      const claim = this.renewOnce();
      this.claim = claim;
      this.renewing = claim.finally(() => {
        this.renewing = null;
      });
      // Read by the renewer (a failure is a failed renewal there); never unhandled.
      this.renewing.catch(() => undefined);
    }
    this.schedule();
    this.listen();
  }

  /** The resource requests are routed by: the only one, or a set's first (all share its slot). */
  private get route(): string {
    return this.members.resources[0] ?? "";
  }

  private get firstFence(): number {
    return this.members.fences[0] ?? 0;
  }

  /**
   * Joins each member's channel (not awaited: a revocation before the subscription is confirmed
   * is caught by the next renewal), or joins it again where the subscription failed or the
   * resource's slot moved to another server.
   */
  private listen(): void {
    if (this.lostError !== null || this.finished) return;
    const channels = this.locks.channels;
    this.members.resources.forEach((resource, index) => {
      const watch = this.watches[index] ?? null;
      if (watch !== null) {
        if (!watch.broken && watch.node === this.locks.via.nodeOf(resource)) return;
        channels.leave(watch);
      }
      const fence = this.members.fences[index] ?? 0;
      this.watches[index] = channels.listen(resource, (message) => {
        this.heard(message, fence);
      });
    });
  }

  /** A message on a member's channel: a revocation of that member's fence loses the lease. */
  private heard(message: string, fence: number): void {
    const revocation = revocationOf(message);
    if (revocation === null || !revokes(revocation, fence)) return;
    try {
      this.lose("revoked", revocation.reason);
    } catch (error) {
      // A `lost` listener threw: emitted, never thrown into the subscriber's connection.
      this.report(error);
    }
  }

  /** Leaves the members' channels (once the lease is lost or released). */
  private unlisten(): void {
    this.finished = true;
    for (const watch of this.watches) if (watch !== null) this.locks.channels.leave(watch);
    this.watches = this.watches.map(() => null);
  }

  /** Aborted when the lease is lost; its reason is the LeaseLostError. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** The LeaseLostError once the lease is lost, else null. */
  get lost(): LeaseLostError | null {
    return this.lostError;
  }

  /**
   * A conservative end of the lease, ms on performance.now(): never after the server's deadline.
   * A lease a ticket started on its own channel's message has the window that message gives
   * until its claim (the first renewal, sent at the grant; `renew()` answers with it) is answered.
   */
  get expiresAt(): number {
    return this.localExpiry;
  }

  /** Throws the LeaseLostError if the lease is lost, or if its local expiry passed. */
  check(): void {
    if (this.releasing === null) this.expired();
    if (this.lostError !== null) throw this.lostError;
  }

  /**
   * Loses the lease if its local expiry passed (true then): unreachable when the last renewal
   * sent got no answer (failed, timed out, or still outstanding), stalled when none was awaiting
   * one: this process did not run in time to renew.
   */
  private expired(): boolean {
    if (this.lostError !== null) return true;
    if (performance.now() < this.localExpiry) return false;
    this.lose(this.unanswered ? "unreachable" : "stalled");
    return true;
  }

  private schedule(): void {
    if (this.releasing !== null || this.lostError !== null) return;
    let due = Math.min(this.nextRenewal, this.localExpiry);
    if (this.holdEnd !== null) due = Math.min(due, this.holdEnd - MAX_HOLD_ROUNDING);
    this.timer = setTimeout(() => {
      this.timer = null;
      // Nothing awaits the renewer: whatever it throws (a `lost` listener's error) is emitted.
      this.tick().catch((error: unknown) => {
        this.report(error);
      });
    }, Math.max(0, due - performance.now()));
  }

  private async tick(): Promise<void> {
    const now = performance.now();
    if (this.holdEnd !== null && now >= this.holdEnd - MAX_HOLD_ROUNDING) {
      this.lose("max_hold");
      return;
    }
    // The expiry first: a renewal found due after it is never sent.
    if (this.expired()) return;
    const claim = this.claim;
    if (claim !== null) {
      // The claim sent at the grant is the first renewal: its answer read as one.
      this.claim = null;
      await claim.catch(() => false);
    } else if (now >= this.nextRenewal) await this.renewOnce().catch(() => false);
    this.schedule();
  }

  /**
   * @internal Marks the lease lost (once): aborts its signal, logs, counts, releases (not after a
   * revocation of a single lease: the server ended the lease itself).
   */
  lose(reason: LossReason, detail = ""): void {
    if (this.lostError !== null) return;
    const lost = new LeaseLostError(this.route, this.firstFence, reason, detail, this.whole ? this.members : undefined);
    this.lostError = lost;
    if (this.timer !== null) clearTimeout(this.timer);
    this.unlisten();
    this.set.metrics.leaseLost?.(reason);
    this.log("warn", "dlock: lease lost", detail === "" ? { reason } : { reason, detail });
    if (reason === "revoked" && this.releasing === null && !this.whole) {
      // Nothing to release: the lease is gone on the server, which may have passed it on. (A
      // set's other members are still held: its best-effort RELEASEALL follows.)
      this.set.metrics.held?.((performance.now() - this.granted) / 1000);
      this.releasing = Promise.resolve({ lost, notReleased: null });
    }
    this.controller.abort(lost);
    this.emit("lost", lost);
    if (this.releasing === null) {
      // A best-effort RELEASE with FENCE (a set's RELEASEALL with FENCES): what the server still
      // holds passes on at once. Nobody may await it: it never rejects. Whatever it answers, it
      // is no release failure (neither logged nor counted: the loss was, once); a failure is
      // only emitted as `error`.
      this.releasing = this.sendRelease().then(
        () => ({ lost, notReleased: null }),
        (error: unknown) => {
          this.report(error);
          return { lost, notReleased: null };
        },
      );
    }
  }

  /**
   * Sends a RENEW (a set's RENEWALL) now (the renewer does every ttl/3): true renewed; false
   * refused (the lease is then lost: renewal_refused). Rejects when no answer came in time.
   */
  renew(): Promise<boolean> {
    // Not sent once the local expiry passed: the lease is lost then.
    if (this.releasing === null ? this.expired() : this.lostError !== null) return Promise.resolve(false);
    this.renewing ??= this.renewOnce().finally(() => {
      this.renewing = null;
    });
    return this.renewing;
  }

  private async renewOnce(): Promise<boolean> {
    let ttl = this.ttl;
    if (this.holdEnd !== null) ttl = Math.min(ttl, this.holdEnd - performance.now());
    ttl = millis(ttl);
    const sent = performance.now();
    const timeout = Math.max(1, Math.min(this.set.requestTimeout, this.localExpiry - sent));
    this.unanswered = true;
    try {
      const reply = await this.locks.call(this.route, timeout, () =>
        this.whole
          ? renewAllArgs(this.members.resources, this.token, ttl, this.members.fences)
          : renewArgs(this.route, this.token, ttl, this.locks.fenceArg(RENEW, this.firstFence)),
      );
      this.unanswered = false;
      if (flagOf(reply)) {
        this.localExpiry = sent + ttl;
        this.nextRenewal = performance.now() + this.ttl / 3;
        if (this.releasing === null) this.listen();
        this.emit("renewed", this.localExpiry);
        return true;
      }
      this.set.metrics.renewalFailed?.("refused");
      this.log("warn", "dlock: renewal failed", { reason: "refused" });
      // A RENEW in flight as release() ran may be refused: not a loss.
      if (this.releasing === null) this.lose("renewal_refused");
      return false;
    } catch (error) {
      this.set.metrics.renewalFailed?.("error");
      this.log("warn", "dlock: renewal failed", { reason: "error", error: String(error) });
      this.nextRenewal = performance.now() + this.ttl / 10;
      this.report(error);
      throw error;
    }
  }

  private async sendRelease(): Promise<unknown> {
    this.set.metrics.held?.((performance.now() - this.granted) / 1000);
    const timeout = releaseTimeout(this.set);
    return this.locks.call(this.route, timeout, () =>
      this.whole
        ? releaseAllArgs(this.members.resources, this.token, this.members.fences)
        : releaseArgs(this.route, this.token, this.locks.fenceArg(RELEASE, this.firstFence)),
    );
  }

  /** @internal Stops the renewals and releases (once); never throws. */
  settle(): Promise<Settled> {
    if (this.releasing === null) {
      // The work ended after the local expiry (its event loop blocked past it, say): it was not
      // protected to its end. Lost, not released: the loss sends the best-effort RELEASE.
      try {
        this.expired();
      } catch (error) {
        // A `lost` listener threw: emitted, never thrown from here.
        this.report(error);
      }
    }
    this.releasing ??= this.releaseOnce();
    return this.releasing;
  }

  private async releaseOnce(): Promise<Settled> {
    try {
      return await this.releaseNow();
    } finally {
      // Listening until the RELEASE is answered: a revocation that beat it is reported as such.
      this.unlisten();
    }
  }

  private async releaseNow(): Promise<Settled> {
    if (this.timer !== null) clearTimeout(this.timer);
    if (this.lostError !== null) return { lost: this.lostError, notReleased: null };
    try {
      const reply = await this.sendRelease();
      // Every member released (a RELEASE answers 1); fewer: some member ended before.
      if (countOf(reply) === this.members.resources.length) {
        this.log("info", "dlock: lease released", {});
        return { lost: null, notReleased: null };
      }
      // Gone before the work ended: the end of the work was not protected. The loss `ended`,
      // logged and counted as such, not as a release failure too.
      this.releasing = Promise.resolve({ lost: null, notReleased: null });
      this.lose("ended");
      return { lost: this.lostError, notReleased: null };
    } catch (error) {
      // Outcome unknown for a lease believed live: a release failure.
      this.set.metrics.releaseFailed?.();
      this.log("warn", "dlock: release failed", { error: String(error) });
      this.report(error);
      if (performance.now() >= this.localExpiry) {
        this.lose("unreachable");
        return { lost: this.lostError, notReleased: null };
      }
      return {
        lost: null,
        notReleased: new NotReleasedError(this.route, this.firstFence, error, this.whole ? this.members : undefined),
      };
    }
  }

  /**
   * Stops the renewals and releases the lease (DLOCK.RELEASE with FENCE; a set: DLOCK.RELEASEALL
   * with FENCES) in one request bounded by the release timeout. Rejects with the LeaseLostError when the lease was lost (or found
   * gone now: ended), with NotReleasedError when the server did not answer (the lease then ends
   * with its ttl). Later calls settle the same way.
   */
  async release(): Promise<void> {
    const { lost, notReleased } = await this.settle();
    if (lost !== null) throw lost;
    if (notReleased !== null) throw notReleased;
  }

  /**
   * `await using lease = await locks.hold(…)` (or `locks.holdAll(…)`): releases at the end of the
   * block. A loss is thrown
   * (never silent); a release that got no answer is logged, counted and emitted as `error`, not
   * thrown, so it never hides the block's own error. `locks.using` keeps the block's error
   * exactly.
   */
  async [Symbol.asyncDispose](): Promise<void> {
    const { lost } = await this.settle();
    if (lost !== null) throw lost;
  }

  /** @internal */
  protected fencedBy(resource: string, fence: number, command: readonly string[]): Promise<unknown> {
    return this.locks.fenced(resource, fence, command);
  }

  /** @internal */
  protected fenceCheckBy(resource: string, fence: number): Promise<boolean> {
    return this.locks.fenceCheck(resource, fence);
  }

  /** Emits error, only when someone listens (an `error` event without a listener throws). */
  private report(error: unknown): void {
    if (this.listenerCount("error") > 0) this.emit("error", error);
  }

  /** @internal The fields of its log lines: resource, owner, fence (a set's members and fences, each joined by ","). */
  get logFields(): { resource: string; owner: string; fence: number | string } {
    return this.whole
      ? { resource: this.members.resources.join(","), owner: this.token, fence: this.members.fences.join(",") }
      : { resource: this.route, owner: this.token, fence: this.firstFence };
  }

  private log(level: "info" | "warn", message: string, fields: Record<string, unknown>): void {
    this.set.logger?.[level](message, { ...this.logFields, ...fields });
  }
}

/** A granted lease on one resource (Locks.hold, write, read, semaphore, campaign). */
export class Lease extends Held {
  readonly resource: string;
  /** The fencing token: larger for every newer grant of the resource. Send it with every write. */
  readonly fence: number;

  /** @internal */
  constructor(
    locks: Locks,
    resource: string,
    token: string,
    fence: number,
    mode: Mode,
    ttl: number,
    set: Settings,
    sent: number,
    holdEnd: number | null,
    /** Started on its ticket's `granted` message: the local expiry it gives; claimed at once. */
    started?: number,
  ) {
    super(locks, { resources: [resource], fences: [fence] }, false, token, mode, ttl, set, sent, holdEnd, started);
    this.resource = resource;
    this.fence = fence;
  }

  /** DLOCK.FENCED under this lease's fence; see Locks.fenced. */
  fenced(command: readonly string[]): Promise<unknown> {
    return this.fencedBy(this.resource, this.fence, command);
  }

  /** Whether this lease's fence still holds the resource on the server. */
  fenceCheck(): Promise<boolean> {
    return this.fenceCheckBy(this.resource, this.fence);
  }
}

/**
 * A granted set (Locks.holdAll): one token owns every one of `resources`, each with a fence of its
 * own, renewed, lost and released whole (the loss of any member is the loss of the set).
 */
export class SetLease extends Held {
  /** @internal */
  constructor(locks: Locks, members: Members, token: string, ttl: number, set: Settings, sent: number, holdEnd: number | null) {
    super(locks, members, true, token, { shared: false, permits: 0 }, ttl, set, sent, holdEnd);
  }

  /** The set's resources, in the order they were asked for. */
  get resources(): readonly string[] {
    return this.members.resources;
  }

  /** Each member's fencing token, in the order of `resources`. */
  get fences(): readonly number[] {
    return this.members.fences;
  }

  /**
   * The fencing token of the member resource: send it with every write that member protects.
   * InvalidArgumentError if resource is not in the set.
   */
  fence(resource: string): number {
    const index = this.members.resources.indexOf(resource);
    const fence = this.members.fences[index];
    if (index < 0 || fence === undefined) {
      throw new InvalidArgumentError(`"${resource}" is not in the set ${this.members.resources.map((r) => `"${r}"`).join(", ")}`);
    }
    return fence;
  }

  /** DLOCK.FENCED under the fence of the member resource; see Locks.fenced. */
  async fenced(resource: string, command: readonly string[]): Promise<unknown> {
    return this.fencedBy(resource, this.fence(resource), command);
  }

  /** Whether the member resource's fence still holds it on the server. */
  async fenceCheck(resource: string): Promise<boolean> {
    return this.fenceCheckBy(resource, this.fence(resource));
  }
}
