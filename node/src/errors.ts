// The errors of the client: one base class, DlockError, with a `code` every subclass sets, so
// `instanceof` and `error.code` both work (also across the ESM and CommonJS builds, by code).

import type { ErrorClass } from "./protocol.js";

/**
 * Loss reasons (docs/protocol.md, section 4): LeaseLostError.reason, the log field, the metrics
 * label. `renewal_refused`: a RENEW answered 0. `unreachable`: the local expiry passed while the
 * last RENEW sent had no answer (it failed, timed out, or was still outstanding). `stalled`: the
 * local expiry passed with no RENEW awaiting an answer: this process did not run in time to
 * renew (a blocked event loop, a stopped process). `max_hold`: the caller's bound on the hold.
 * `ended`: the RELEASE at the hold's end found the lease gone. `revoked`: an operator's
 * DLOCK.REVOKE.
 */
export type LossReason = "renewal_refused" | "unreachable" | "stalled" | "max_hold" | "ended" | "revoked";

/** Outcomes of an acquire that did not grant. */
export type Outcome = "held" | "unreachable" | "unknown" | "server";

/** The base class of every error this client throws. */
export class DlockError extends Error {
  /** A stable code: `ERR_DLOCK_<WHAT>`. */
  readonly code: string;
  constructor(code: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.name = new.target.name;
  }
}

/**
 * The resource stayed held by others until the wait ended (the `wait` option, or the caller's
 * AbortSignal). Nothing is held: a grant the attempt may not have learned was released.
 */
export class NotAcquiredError extends DlockError {
  /** The resource; a set's (holdAll) resources joined by "," (also in the errors below). */
  readonly resource: string;
  readonly token: string;
  constructor(resource: string, token: string, cause?: unknown) {
    super("ERR_DLOCK_NOT_ACQUIRED", `dlock: "${resource}" not acquired: held by another owner`, { cause });
    this.resource = resource;
    this.token = token;
  }
}

/** No request of the attempt could have reached a server: nothing was granted. */
export class UnreachableError extends DlockError {
  readonly resource: string;
  readonly token: string;
  constructor(resource: string, token: string, cause?: unknown) {
    super("ERR_DLOCK_UNREACHABLE", `dlock: "${resource}" not acquired: server unreachable (${describe(cause)})`, {
      cause,
    });
    this.resource = resource;
    this.token = token;
  }
}

/**
 * A request may have reached the server and no answer came before the deadline; the attempt's
 * token was released (`released` says whether a grant was found and freed).
 */
export class UnknownOutcomeError extends DlockError {
  readonly resource: string;
  readonly token: string;
  readonly released: boolean;
  constructor(resource: string, token: string, released: boolean, cause?: unknown) {
    super(
      "ERR_DLOCK_UNKNOWN_OUTCOME",
      `dlock: "${resource}": outcome unknown (token released: ${String(released)}): ${describe(cause)}`,
      { cause },
    );
    this.resource = resource;
    this.token = token;
    this.released = released;
  }
}

/** A set's members, in the order asked, each with its fence (Locks.holdAll). */
export interface Members {
  resources: readonly string[];
  fences: readonly number[];
}

/** What an error says a lease was: `lease on "r" (fence 5)`, `set lease on "a", "b" (fences 1, 2)`. */
function leaseOf(resource: string, fence: number, set: Members | undefined): string {
  if (set === undefined) return `lease on "${resource}" (fence ${String(fence)})`;
  return `set lease on ${set.resources.map((r) => `"${r}"`).join(", ")} (fences ${set.fences.join(", ")})`;
}

/**
 * The lease ended before the work did; work after that was not protected. A set (Locks.holdAll)
 * is lost whole: `resources` and `fences` name every member in the order asked, `resource` and
 * `fence` its first (a single lease: its own, once each).
 */
export class LeaseLostError extends DlockError {
  readonly resource: string;
  readonly fence: number;
  readonly resources: readonly string[];
  readonly fences: readonly number[];
  readonly reason: LossReason;
  /** What the loss's source said: for `revoked`, the operator's REASON; "" when nothing was said. */
  readonly detail: string;
  constructor(resource: string, fence: number, reason: LossReason, detail = "", set?: Members) {
    super("ERR_DLOCK_LEASE_LOST", `dlock: ${leaseOf(resource, fence, set)} lost: ${reason}${detail === "" ? "" : ` (${detail})`}`);
    this.resource = resource;
    this.fence = fence;
    this.resources = set?.resources ?? [resource];
    this.fences = set?.fences ?? [fence];
    this.reason = reason;
    this.detail = detail;
  }
}

/**
 * The work succeeded but its lease could not be released (it ends with its ttl). A set's names
 * every member in `resources` and `fences`, as LeaseLostError does.
 */
export class NotReleasedError extends DlockError {
  readonly resource: string;
  readonly fence: number;
  readonly resources: readonly string[];
  readonly fences: readonly number[];
  constructor(resource: string, fence: number, cause?: unknown, set?: Members) {
    super("ERR_DLOCK_NOT_RELEASED", `dlock: ${leaseOf(resource, fence, set)} not released: ${describe(cause)}`, {
      cause,
    });
    this.resource = resource;
    this.fence = fence;
    this.resources = set?.resources ?? [resource];
    this.fences = set?.fences ?? [fence];
  }
}

/** A fenced write was refused: the fence no longer holds the resource. Nothing ran. */
export class StaleError extends DlockError {
  readonly resource: string;
  readonly fence: number;
  /** The server's message, or the store's ("0 rows updated"). */
  readonly detail: string;
  constructor(resource: string, fence: number, detail: string) {
    super("ERR_DLOCK_STALE", `dlock: stale fence ${String(fence)} on "${resource}", write refused: ${detail}`);
    this.resource = resource;
    this.fence = fence;
    this.detail = detail;
  }
}

/** A caller's mistake found before anything was sent (a ttl of 0, a semaphore of 0 permits). */
export class InvalidArgumentError extends DlockError {
  constructor(message: string) {
    super("ERR_DLOCK_INVALID_ARGUMENT", `dlock: ${message}`);
  }
}

/** An error reply of the server, with its class (docs/protocol.md, section 9). */
export class ServerError extends DlockError {
  readonly class: ErrorClass;
  readonly reply: string;
  constructor(errorClass: ErrorClass, reply: string) {
    super(`ERR_DLOCK_${errorClass.toUpperCase()}`, reply);
    this.class = errorClass;
    this.reply = reply;
  }
}

/** A request that got no answer within its timeout (the client's side: it may have arrived). */
export class RequestTimeoutError extends DlockError {
  constructor(timeoutMs: number) {
    super("ERR_DLOCK_TIMEOUT", `dlock: no answer within ${String(timeoutMs)} ms`);
  }
}

function describe(cause: unknown): string {
  if (cause instanceof Error) return cause.message;
  return cause === undefined ? "no answer" : JSON.stringify(cause);
}
