// A drop-in shaped like node-redlock's `Redlock` (acquire, release, extend, using, quit, the
// `error` event), on dlock: existing code switches by changing its import and its constructor
// line (one client). The differences are the point: the lock is one server-side lease with a
// fence (no quorum of independent servers, no retry loop with sleeps: the server queues
// waiters), it renews itself, `using`'s signal is aborted the moment the lease is lost for any
// reason, and its release is bounded.

import { EventEmitter } from "node:events";

import { Locks } from "./locks.js";
import type { Lease } from "./lease.js";
import type { RedisLike } from "./adapters.js";
import { runUnder } from "./locks.js";
import { InvalidArgumentError } from "./errors.js";

/**
 * node-redlock's settings. The retry settings become one wait in the server's queue; the others
 * are accepted and have nothing to do here (one server decides, no clock drift to allow for, and
 * every lock renews itself every third of its duration, not only under `using`).
 */
export interface RedlockSettings {
  /** How long acquire waits in line, ms. Default: retryCount × retryDelay if either is given, else 10 000. */
  wait?: number;
  /** With retryDelay, the wait (redlock's default 10; -1: no limit; 0: one try). */
  retryCount?: number;
  /** With retryCount, the wait (redlock's default 200 ms). */
  retryDelay?: number;
  retryJitter?: number;
  driftFactor?: number;
  automaticExtensionThreshold?: number;
}

/** The AbortSignal `using` gives its routine: `error` is the LeaseLostError once aborted. */
export type RedlockAbortSignal = AbortSignal & { error?: Error };

/** The wait the settings give, ms. */
function waitOf(settings: RedlockSettings, fallback: number): number {
  if (settings.wait !== undefined) return settings.wait;
  if (settings.retryCount === undefined && settings.retryDelay === undefined) return fallback;
  const count = settings.retryCount ?? 10;
  return count < 0 ? Infinity : count * (settings.retryDelay ?? 200);
}

/** A held lock, as node-redlock's `Lock`: resources, value (the token), expiration, and the fence. */
export class Lock {
  constructor(
    private readonly redlock: Redlock,
    readonly lease: Lease,
    readonly resources: string[],
  ) {}
  /** The owner token. */
  get value(): string {
    return this.lease.token;
  }
  /** The fencing token: send it with every write the lock protects. */
  get fence(): number {
    return this.lease.fence;
  }
  /** Epoch ms by this process's clock, conservative. */
  get expiration(): number {
    return Date.now() + (this.lease.expiresAt - performance.now());
  }
  /** Sends one renewal now (the lock renews itself anyway); see Redlock.extend. */
  extend(duration?: number): Promise<Lock> {
    return this.redlock.extend(this, duration);
  }
  release(): Promise<void> {
    return this.redlock.release(this);
  }
}

/**
 * node-redlock's `Redlock` on dlock. Emits `error` (only when listened to) for a failed renewal
 * or release of a lock, as node-redlock does for a failing client.
 */
export class Redlock extends EventEmitter {
  private readonly locks: Locks;
  private readonly wait: number;
  /** Takes one client (ioredis or node-redis); redlock's list of clients is one server here. */
  constructor(clients: RedisLike | Iterable<RedisLike>, settings: RedlockSettings = {}) {
    super();
    const list: RedisLike[] = isIterable(clients) ? [...clients] : [clients];
    const client = list[0];
    if (client === undefined || list.length !== 1) {
      throw new InvalidArgumentError("dlock's Redlock takes exactly one client: one server (or cluster) holds the lease");
    }
    this.locks = new Locks(client);
    this.wait = waitOf(settings, 10_000);
  }
  private static resource(resources: string[]): string {
    if (resources.length !== 1 || resources[0] === undefined) {
      throw new InvalidArgumentError("dlock's Redlock locks exactly one resource per lock");
    }
    return resources[0];
  }
  /**
   * Acquires the lock for duration ms (renewed every third of it until released), waiting in the
   * server's queue for as long as the settings say; rejects with NotAcquiredError after that.
   */
  async acquire(resources: string[], duration: number, settings: RedlockSettings = {}): Promise<Lock> {
    const lease = await this.locks.hold(Redlock.resource(resources), { ttl: duration, wait: waitOf(settings, this.wait) });
    lease.on("error", (error: unknown) => {
      if (this.listenerCount("error") > 0) this.emit("error", error);
    });
    return new Lock(this, lease, resources);
  }
  /** Releases the lock; rejects with the LeaseLostError if it was lost. */
  release(lock: Lock): Promise<void> {
    return lock.lease.release();
  }
  /**
   * The lock renews itself (its duration is fixed at acquire, and a duration given here does not
   * change it); extend sends one renewal now and returns the same lock, or rejects with the
   * LeaseLostError.
   */
  async extend(lock: Lock, duration?: number): Promise<Lock> {
    if (duration !== undefined && !(duration > 0)) throw new InvalidArgumentError(`extend: duration ${String(duration)} is not positive`);
    await lock.lease.renew();
    lock.lease.check();
    return lock;
  }
  /**
   * Runs routine under the lock; its `signal` is aborted (`signal.error`: the LeaseLostError) the
   * moment the lock is lost, for any reason. Returns routine's result; keeps its error; a loss
   * after a successful routine is thrown.
   */
  using<T>(resources: string[], duration: number, routine: (signal: RedlockAbortSignal) => Promise<T>): Promise<T>;
  using<T>(resources: string[], duration: number, settings: RedlockSettings, routine: (signal: RedlockAbortSignal) => Promise<T>): Promise<T>;
  async using<T>(
    resources: string[],
    duration: number,
    settingsOrRoutine: RedlockSettings | ((signal: RedlockAbortSignal) => Promise<T>),
    maybeRoutine?: (signal: RedlockAbortSignal) => Promise<T>,
  ): Promise<T> {
    const routine = typeof settingsOrRoutine === "function" ? settingsOrRoutine : maybeRoutine;
    const settings = typeof settingsOrRoutine === "function" ? {} : settingsOrRoutine;
    if (routine === undefined) throw new InvalidArgumentError("using needs a routine");
    const lock = await this.acquire(resources, duration, settings);
    return runUnder(lock.lease, (lease) => {
      const signal: RedlockAbortSignal = lease.signal;
      // node-redlock's routines read signal.error after an abort.
      const told = (): void => {
        signal.error = lease.signal.reason as Error;
      };
      if (signal.aborted) told();
      else signal.addEventListener("abort", told, { once: true });
      return routine(signal);
    });
  }
  /** Closes dlock's own connections; the client given to the constructor stays open (yours). */
  quit(): Promise<void> {
    this.locks.close();
    return Promise.resolve();
  }
}

function isIterable(value: RedisLike | Iterable<RedisLike>): value is Iterable<RedisLike> {
  return Array.isArray(value) || (typeof value === "object" && value !== null && Symbol.iterator in value && !("sendCommand" in value) && !("call" in value));
}

export default Redlock;
