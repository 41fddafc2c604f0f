// A drop-in shaped like node-redlock's `Redlock` (acquire, release, extend, using), on dlock:
// existing code switches by changing its import. The differences are the point: the lock is one
// server-side lease with a fence (no quorum of independent servers, no retry loop with sleeps:
// the server queues waiters), `using`'s signal is aborted the moment the lease is lost for any
// reason, and its release is bounded.

import { Locks } from "./locks.js";
import type { Lease } from "./lease.js";
import type { RedisLike } from "./adapters.js";
import { runUnder } from "./locks.js";
import { InvalidArgumentError } from "./errors.js";

/** What node-redlock's settings map to; the retry settings become one server-side wait. */
export interface RedlockSettings {
  /** How long acquire waits in line, ms (redlock: retryCount × retryDelay). Default 10 000. */
  wait?: number;
  retryCount?: number;
  retryDelay?: number;
}

/** A held lock, as node-redlock's `Lock`: resources, value (the token), expiration, and the fence. */
export class Lock {
  constructor(
    readonly lease: Lease,
    readonly resources: string[],
  ) {}
  get value(): string {
    return this.lease.token;
  }
  get fence(): number {
    return this.lease.fence;
  }
  /** Epoch ms by this process's clock, conservative. */
  get expiration(): number {
    return Date.now() + (this.lease.expiresAt - performance.now());
  }
  release(): Promise<void> {
    return this.lease.release();
  }
}

export class Redlock {
  private readonly locks: Locks;
  private readonly wait: number;
  /** Takes one client (ioredis or node-redis); redlock's list of clients is one server here. */
  constructor(clients: RedisLike | RedisLike[], settings: RedlockSettings = {}) {
    const list: RedisLike[] = Array.isArray(clients) ? (clients as RedisLike[]) : [clients];
    const client = list[0];
    if (client === undefined || list.length !== 1) {
      throw new InvalidArgumentError("dlock's Redlock takes exactly one client: one server (or cluster) holds the lease");
    }
    this.locks = new Locks(client);
    this.wait = settings.wait ?? (settings.retryCount !== undefined && settings.retryDelay !== undefined ? settings.retryCount * settings.retryDelay : 10_000);
  }
  private static resource(resources: string[]): string {
    if (resources.length !== 1 || resources[0] === undefined) {
      throw new InvalidArgumentError("dlock's Redlock locks exactly one resource per lock");
    }
    return resources[0];
  }
  /** Acquires the lock for duration ms (renewed automatically until released). */
  async acquire(resources: string[], duration: number, settings: RedlockSettings = {}): Promise<Lock> {
    const lease = await this.locks.hold(Redlock.resource(resources), { ttl: duration, wait: settings.wait ?? this.wait });
    return new Lock(lease, resources);
  }
  release(lock: Lock): Promise<void> {
    return lock.release();
  }
  /** The lease renews itself; extend sends one renewal now and returns the same lock. */
  async extend(lock: Lock): Promise<Lock> {
    await lock.lease.renew();
    lock.lease.check();
    return lock;
  }
  /**
   * Runs routine under the lock; its `signal` is aborted (with the LeaseLostError) the moment
   * the lock is lost, for any reason. Returns routine's result; keeps its error; a loss after a
   * successful routine is thrown.
   */
  using<T>(resources: string[], duration: number, routine: (signal: AbortSignal & { error?: Error }) => Promise<T>): Promise<T>;
  using<T>(resources: string[], duration: number, settings: RedlockSettings, routine: (signal: AbortSignal & { error?: Error }) => Promise<T>): Promise<T>;
  async using<T>(
    resources: string[],
    duration: number,
    settingsOrRoutine: RedlockSettings | ((signal: AbortSignal & { error?: Error }) => Promise<T>),
    maybeRoutine?: (signal: AbortSignal & { error?: Error }) => Promise<T>,
  ): Promise<T> {
    const routine = typeof settingsOrRoutine === "function" ? settingsOrRoutine : maybeRoutine;
    const settings = typeof settingsOrRoutine === "function" ? {} : settingsOrRoutine;
    if (routine === undefined) throw new InvalidArgumentError("using needs a routine");
    const lock = await this.acquire(resources, duration, settings);
    return runUnder(lock.lease, (lease) => {
      const signal = lease.signal as AbortSignal & { error?: Error };
      // node-redlock's routines read signal.error after an abort.
      lease.signal.addEventListener("abort", () => {
        signal.error = lease.signal.reason as Error;
      });
      return routine(signal);
    });
  }
}
