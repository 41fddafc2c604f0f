// The options of Locks and of each call, their defaults, and where log lines and figures go.

import type { LossReason } from "./errors.js";

/**
 * Where the ownership log lines go (console, pino, winston… fit). Default: nowhere. Lines, with
 * the fields resource, owner (the token) and fence (a set's: its resources and its fences, each
 * joined by ","): `dlock: lease acquired` (info, with mode),
 * `dlock: lease released` (info), `dlock: renewal failed` (warn, reason refused or error),
 * `dlock: lease lost` (warn, reason; detail for a revocation), `dlock: release failed` (warn,
 * error: a RELEASE with no answer for a lease still believed live, never after a loss), and
 * `dlock: stale operation rejected` (warn; resource, fence and the server's reply as reason).
 */
export interface Logger {
  info(message: string, fields: Record<string, unknown>): void;
  warn(message: string, fields: Record<string, unknown>): void;
  debug?(message: string, fields: Record<string, unknown>): void;
}

/**
 * The client's figures (docs/protocol.md, section 13); every method is optional. A set
 * (Locks.holdAll) counts as one lease in every figure: one attempt, one grant, one loss.
 */
export interface Metrics {
  /** dlock_client_acquire_attempts_total */
  acquireAttempt?(): void;
  /** dlock_client_acquire_failures_total{reason}: held, unreachable, unknown, server */
  acquireFailed?(reason: string): void;
  /** dlock_client_acquire_seconds */
  acquired?(seconds: number): void;
  /** dlock_client_hold_seconds */
  held?(seconds: number): void;
  /** dlock_client_renewal_failures_total{reason}: refused, error */
  renewalFailed?(reason: "refused" | "error"): void;
  /**
   * dlock_client_release_failures_total: a RELEASE whose outcome is unknown (no answer, a
   * connection or server error) for a lease still believed live. Not a RELEASE answered 0 at the
   * hold's end (that is the loss `ended`), nor the best-effort RELEASE after a loss.
   */
  releaseFailed?(): void;
  /**
   * dlock_client_leases_lost_total{reason}: once per lost lease; reason renewal_refused,
   * unreachable, stalled, max_hold, ended or revoked.
   */
  leaseLost?(reason: LossReason): void;
  /** dlock_client_stale_writes_total */
  staleWrite?(): void;
}

/** Options of a Locks (the defaults of every call) and of each call. Durations in ms. */
export interface Options {
  /** The lease's length (default 30 000; campaign 10 000); renewed every third of it. */
  ttl?: number;
  /** How long to wait in the server's queue (default 10 000; 0: one try; Infinity: no limit). */
  wait?: number;
  /** Bounds one request (default 2 000); a wait adds its own length. Sets the claim window. */
  requestTimeout?: number;
  /** Bounds the RELEASE at the end of a hold (default: the request timeout). */
  releaseTimeout?: number;
  /** How waits are made: a blocking WAIT on a connection of its own (default), or tickets. */
  strategy?: "block" | "tickets";
  /** A ticket's life with strategy "tickets" (default 6 000), refreshed every third of it. */
  ticket?: number;
  /** Bounds the whole hold: renewals never go past it, then the lease is lost (max_hold). */
  maxHold?: number;
  /** Describes the holder (DLOCK.ACQUIRE … META); DLOCK.INFO shows it. */
  meta?: string;
  logger?: Logger;
  metrics?: Metrics;
}

/** Options of one acquire. */
export interface HoldOptions extends Omit<Options, "logger" | "metrics"> {
  /** Cancels the wait; a grant the attempt may not have learned is then released. */
  signal?: AbortSignal;
}

/**
 * Options of one holdAll: those of hold, less the way of waiting (a set always waits with a
 * ticket in every member's line, as long as its wait: from 1 s to 30 s).
 */
export type SetOptions = Omit<HoldOptions, "strategy" | "ticket">;

export interface Settings {
  ttl: number;
  wait: number;
  requestTimeout: number;
  releaseTimeout: number;
  strategy: "block" | "tickets";
  ticket: number;
  maxHold: number | null;
  meta: string | null;
  logger: Logger | null;
  metrics: Metrics;
}

export function defaults(options: Options = {}): Settings {
  return merge(
    {
      ttl: 30_000,
      wait: 10_000,
      requestTimeout: 2_000,
      releaseTimeout: 0,
      strategy: "block",
      ticket: 6_000,
      maxHold: null,
      meta: null,
      logger: null,
      metrics: {},
    },
    options,
  );
}

export function merge(base: Settings, options: Options): Settings {
  const set = { ...base };
  if (options.ttl !== undefined) set.ttl = options.ttl;
  if (options.wait !== undefined) set.wait = options.wait;
  if (options.requestTimeout !== undefined) set.requestTimeout = options.requestTimeout;
  if (options.releaseTimeout !== undefined) set.releaseTimeout = options.releaseTimeout;
  if (options.strategy !== undefined) set.strategy = options.strategy;
  if (options.ticket !== undefined) set.ticket = options.ticket;
  if (options.maxHold !== undefined) set.maxHold = options.maxHold;
  if (options.meta !== undefined) set.meta = options.meta;
  if (options.logger !== undefined) set.logger = options.logger;
  if (options.metrics !== undefined) set.metrics = options.metrics;
  return set;
}

/** The release timeout (the request timeout unless set). */
export function releaseTimeout(set: Settings): number {
  return set.releaseTimeout > 0 ? set.releaseTimeout : set.requestTimeout;
}

/** The claim window: twice the request timeout, at least 1 s (the form caps it by the ttl). */
export function claimMs(set: Settings): number {
  return Math.max(1000, 2 * Math.ceil(set.requestTimeout));
}

/** A length as the server is told it: whole ms rounded down (never longer than asked), ≥ 1. */
export function millis(ms: number): number {
  return Math.max(1, Math.floor(ms));
}

/** A wait as the server is told it: whole ms rounded up, ≥ 1. */
export function millisUp(ms: number): number {
  return Math.max(1, Math.ceil(ms));
}
