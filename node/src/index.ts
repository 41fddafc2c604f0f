// dlock for Node: lease locks with fencing tokens on Redis or Valkey, through ioredis or
// node-redis. See README.md; docs/protocol.md in the repository is the contract it follows.

export { Locks, newToken } from "./locks.js";
export { VERSION } from "./version.js";
export { Lease, SetLease, type Held } from "./lease.js";
export { fencedSql, type SqlClient } from "./sql.js";
export {
  DlockError,
  InvalidArgumentError,
  LeaseLostError,
  NotAcquiredError,
  NotReleasedError,
  RequestTimeoutError,
  ServerError,
  StaleError,
  UnknownOutcomeError,
  UnreachableError,
  type LossReason,
  type Members,
} from "./errors.js";
export type { HoldOptions, Logger, Metrics, Options, SetOptions } from "./options.js";
export { channelName, keySlot, tokenTag, errorClass, MAX_PERMITS, MAX_SET, type ErrorClass, type Holder, type Info, type Leader } from "./protocol.js";
export type { RedisLike } from "./adapters.js";
