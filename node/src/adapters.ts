// The Redis clients this package works with, behind one small interface: a request routed to
// the resource's primary, a connection of the client's own for a blocking wait, and a subscriber
// for the resources' channels. ioredis (Redis, Cluster) and node-redis (createClient,
// createCluster) are recognised by shape: neither is imported here, both are peer dependencies.
//
// What dlock asks of the caller's client: short requests only (ACQUIRE without WAIT, RENEW,
// RELEASE, FENCECHECK, INFO), each bounded by the request timeout. A WAIT never goes on the
// caller's client: it goes on a duplicate whose settings cannot cut it (no socket timeout below
// the wait, a command timeout above it, no re-sending after a reconnect). Nor does a FENCED:
// ioredis sends an unanswered command again after a reconnect, and node-redis sends what it
// queued while disconnected once connected again, either of which could run a fenced write twice
// or long after the caller was told it failed. It goes on a duplicate of dlock's own that sends
// each command at most once (sendOnce).

import { performance } from "node:perf_hooks";
import { setTimeout as sleepFor } from "node:timers/promises";

import { RequestTimeoutError } from "./errors.js";
import { keySlot } from "./protocol.js";

/** Between two looks for a slot map that a refresh did not bring. */
const LOCATE_PAUSE = 20;

/**
 * A connection of dlock's own to one server: for one blocking wait, a lone RELEASE, or the fenced
 * writes. It is never opened again once closed, and never sends a command twice.
 */
export interface Connection {
  send(args: readonly string[], timeoutMs: number): Promise<unknown>;
  /** Disconnects at once (a wait in the server ends with it). */
  close(): void;
  /** Closed: by close(), by the server or by the network. */
  readonly closed: boolean;
  /** Lets the process exit while the connection is open and idle. */
  unref(): void;
}

/** What a subscriber tells its owner. */
export interface SubscriberEvents {
  message(channel: string, message: string): void;
  /** A channel's subscription was confirmed, or made again after a reconnect. */
  subscribed(channel: string): void;
}

/** A pub/sub connection to one server (SSUBSCRIBE in a cluster). */
export interface Subscriber {
  subscribe(channel: string): Promise<void>;
  unsubscribe(channel: string): Promise<void>;
  /** Idle (no channel): lets the process exit while it stays open; busy again: keeps it alive. */
  idle(idle: boolean): void;
  close(): void;
}

/** The caller's Redis client, as dlock uses it. */
export interface Transport {
  readonly kind: "ioredis" | "node-redis";
  readonly cluster: boolean;
  /** One short request to the primary of resource's slot, answered within timeoutMs. */
  send(resource: string, args: readonly string[], timeoutMs: number): Promise<unknown>;
  /**
   * A new connection to the primary of resource's slot with the caller's settings (address,
   * credentials, database, TLS) but none of its timeouts, retries or re-sending; commandTimeoutMs
   * (ioredis) is set above what the connection will wait for.
   */
  open(resource: string, connectTimeoutMs: number, commandTimeoutMs: number): Promise<Connection>;
  /** The address of the primary serving resource now ("" on a single server, or not known yet). */
  nodeOf(resource: string): string;
  /**
   * The address of the primary serving resource, once known: a cluster client that has not
   * learned its slot map yet (still connecting) is waited for, at most timeoutMs ("" then).
   */
  locate(resource: string, timeoutMs: number): Promise<string>;
  /** A subscriber on the primary serving resource. */
  subscriber(resource: string, events: SubscriberEvents, timeoutMs: number): Promise<Subscriber>;
  /**
   * Sends args at most once, to the primary serving resource, on a connection of dlock's own
   * (one per server, kept open) that never sends a command again after a reconnection and queues
   * nothing while disconnected: a dropped connection fails the request (its outcome unknown) and
   * is opened again for the next. In a cluster, MOVED (nothing ran) is followed and ASK is
   * followed with ASKING, at most 5 times. For DLOCK.FENCED.
   */
  sendOnce(resource: string, args: readonly string[], timeoutMs: number): Promise<unknown>;
  /** Closes the connections of sendOnce. */
  close(): void;
}

/** An ioredis `Redis` or `Cluster`, or a node-redis client or cluster. */
export type RedisLike = object;

/** The server's error reply an error carries (code first), or null for any other error. */
export function replyText(error: unknown): string | null {
  if (!(error instanceof Error)) return null;
  // ioredis: ReplyError (redis-errors); node-redis: ErrorReply, SimpleError, BlobError.
  const names = ["ReplyError", "ErrorReply", "SimpleError", "BlobError"];
  if (names.includes(error.name) || names.includes(error.constructor.name)) return error.message;
  return null;
}

/** Whether a failed request surely never reached a server (a refused connection). */
export function notSent(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  if (code === "ECONNREFUSED") return true;
  const cause = (error as { cause?: unknown } | null)?.cause;
  return cause !== undefined && cause !== error && notSent(cause);
}

/** Settles with promise, or rejects with RequestTimeoutError after timeoutMs. */
export function within<T>(promise: Promise<T>, timeoutMs: number): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => {
      reject(new RequestTimeoutError(timeoutMs));
    }, Math.max(1, timeoutMs));
    promise.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        clearTimeout(timer);
        reject(error instanceof Error ? error : new Error(String(error)));
      },
    );
  });
}

/** "host:port" (the last colon splits: an IPv6 host keeps its own). */
function hostPort(address: string): { host: string; port: number } {
  const colon = address.lastIndexOf(":");
  return { host: address.slice(0, colon), port: Number(address.slice(colon + 1)) };
}

/** What a redirect names: the server to ask, and whether it is an ASK (one command only). */
function redirectOf(error: unknown): { address: string; ask: boolean } | null {
  const text = replyText(error);
  if (text === null) return null;
  const words = text.split(" ");
  if ((words[0] !== "MOVED" && words[0] !== "ASK") || words.length < 3) return null;
  return { address: words[2] ?? "", ask: words[0] === "ASK" };
}

const MAX_REDIRECTS = 5;

/**
 * The connections of sendOnce: one per server ("" on a single server), opened when first needed,
 * idle ones not keeping the process alive, opened again after one was closed. A connection whose
 * request got no answer (a timeout, a drop) is closed: a reply that comes later answers nobody,
 * and nothing waits behind it.
 */
class AtMostOnce {
  private readonly connections = new Map<string, Promise<Connection>>();
  constructor(private readonly connectTo: (address: string, timeoutMs: number) => Promise<Connection>) {}

  /** Sends args once on address's connection; a redirect reply is thrown to the caller. */
  async send(address: string, args: readonly string[], timeoutMs: number): Promise<unknown> {
    const deadline = performance.now() + timeoutMs;
    let made = this.connections.get(address);
    if (made !== undefined) {
      const open = await made.catch(() => null);
      if (open === null || open.closed) {
        if (this.connections.get(address) === made) this.connections.delete(address);
        made = undefined;
      }
    }
    if (made === undefined) {
      made = this.connectTo(address, Math.max(1, deadline - performance.now())).then((connection) => {
        connection.unref();
        return connection;
      });
      this.connections.set(address, made);
      const mine = made;
      // A connection that never opened: nothing was sent; the next request tries again.
      mine.catch(() => {
        if (this.connections.get(address) === mine) this.connections.delete(address);
      });
    }
    const connection = await made;
    try {
      return await connection.send(args, Math.max(1, deadline - performance.now()));
    } catch (error) {
      if (replyText(error) === null) {
        connection.close();
        if (this.connections.get(address) === made) this.connections.delete(address);
      }
      throw error;
    }
  }

  /** ASKING, then args, on a connection opened for them alone (an ASK names one command). */
  async asking(address: string, args: readonly string[], timeoutMs: number): Promise<unknown> {
    const deadline = performance.now() + timeoutMs;
    const connection = await this.connectTo(address, timeoutMs);
    try {
      const asked = connection.send(["ASKING"], timeoutMs);
      const reply = connection.send(args, Math.max(1, deadline - performance.now()));
      await asked;
      return await reply;
    } finally {
      connection.close();
    }
  }

  close(): void {
    for (const made of this.connections.values()) {
      made.then(
        (connection) => {
          connection.close();
        },
        () => undefined,
      );
    }
    this.connections.clear();
  }
}

/**
 * sendOnce in a cluster: to the primary serving resource, following MOVED (nothing ran there) to
 * the server it names and ASK with ASKING, at most 5 times; refresh asks the caller's client to
 * read the slot map again after a MOVED.
 */
async function sendOnceInCluster(
  once: AtMostOnce,
  address: string,
  args: readonly string[],
  timeoutMs: number,
  refresh: () => void,
): Promise<unknown> {
  const deadline = performance.now() + timeoutMs;
  for (let redirects = 0; ; redirects++) {
    const left = Math.max(1, deadline - performance.now());
    try {
      return await once.send(address, args, left);
    } catch (error) {
      const redirect = redirectOf(error);
      if (redirect === null || redirects >= MAX_REDIRECTS) throw error;
      if (redirect.ask) return once.asking(redirect.address, args, left);
      refresh();
      address = redirect.address;
    }
  }
}

// The shapes of the two clients this file touches, as little of them as it needs.

interface IoredisOptions {
  host?: string;
  port?: number;
}

interface IoredisLike {
  isCluster: boolean;
  options: IoredisOptions;
  status: string;
  stream?: { unref?(): void; ref?(): void };
  call(...args: string[]): Promise<unknown>;
  sendCommand(command: unknown): Promise<unknown>;
  duplicate(options?: object): IoredisLike;
  disconnect(): void;
  on(event: string, listener: (...args: unknown[]) => void): unknown;
  once(event: string, listener: (...args: unknown[]) => void): unknown;
  subscribe(channel: string): Promise<unknown>;
  unsubscribe(channel: string): Promise<unknown>;
  ssubscribe(channel: string): Promise<unknown>;
  sunsubscribe(channel: string): Promise<unknown>;
}

interface IoredisClusterLike {
  isCluster: true;
  status: string;
  slots: string[][];
  connect(): Promise<void>;
  nodes(role?: string): IoredisLike[];
  sendCommand(command: unknown): Promise<unknown>;
  refreshSlotsCache(callback?: (error?: Error | null) => void): void;
}

type CommandClass = new (name: string, args: string[], options: object) => { args: unknown[] };
/** A Command routed by the key it is given. */
type KeyedCommandClass = new (name: string, args: string[], options: object) => { args: unknown[]; key: string };

interface NodeRedisClientLike {
  options?: { socket?: object };
  isOpen: boolean;
  sendCommand(args: string[]): Promise<unknown>;
  duplicate(overrides?: object): NodeRedisClientLike;
  connect(): Promise<unknown>;
  destroy(): void;
  unref(): void;
  ref(): void;
  on(event: string, listener: (...args: unknown[]) => void): unknown;
  subscribe(channel: string, listener: (message: string, channel: string) => void): Promise<void>;
  unsubscribe(channel: string): Promise<void>;
  sSubscribe(channel: string, listener: (message: string, channel: string) => void): Promise<void>;
  sUnsubscribe(channel: string): Promise<void>;
}

interface NodeRedisClusterLike {
  slots: ({ master: { host: string; port: number } } | undefined)[];
  masters: unknown[];
  nodeByAddress: Map<string, unknown>;
  sendCommand(firstKey: string, isReadonly: boolean, args: string[]): Promise<unknown>;
  nodeClient(node: unknown): Promise<NodeRedisClientLike> | NodeRedisClientLike;
}

/** The Transport of the caller's client; TypeError for anything else. */
export function transportOf(client: RedisLike): Transport {
  const shape = client as Record<string, unknown>;
  if (typeof shape["call"] === "function" && typeof shape["isCluster"] === "boolean") {
    return shape["isCluster"]
      ? new IoredisCluster(client as unknown as IoredisClusterLike)
      : new IoredisSingle(client as unknown as IoredisLike);
  }
  if (typeof shape["sendCommand"] === "function" && "masters" in shape) {
    return new NodeRedisCluster(client as unknown as NodeRedisClusterLike);
  }
  if (typeof shape["sendCommand"] === "function" && typeof shape["duplicate"] === "function") {
    return new NodeRedisSingle(client as unknown as NodeRedisClientLike);
  }
  throw new TypeError("dlock: give an ioredis Redis or Cluster, or a node-redis client or cluster");
}

const quiet = (): void => undefined;

/** ioredis settings of dlock's own connections: nothing may cut or repeat a wait. */
function ioredisOwn(commandTimeoutMs: number): object {
  return {
    autoResendUnfulfilledCommands: false,
    autoResubscribe: true,
    maxRetriesPerRequest: 0,
    enableOfflineQueue: true,
    enableReadyCheck: false,
    lazyConnect: false,
    commandTimeout: commandTimeoutMs,
    socketTimeout: undefined,
    retryStrategy: () => null,
    reconnectOnError: null,
  };
}

async function ioredisOpen(
  base: IoredisLike,
  connectTimeoutMs: number,
  commandTimeoutMs: number,
  at?: { host: string; port: number },
): Promise<Connection> {
  const connection = base.duplicate({ ...ioredisOwn(commandTimeoutMs), ...(at ?? {}) });
  connection.on("error", quiet);
  try {
    await within(
      new Promise<void>((resolve, reject) => {
        if (connection.status === "ready" || connection.status === "connect") {
          resolve();
          return;
        }
        connection.once("connect", () => {
          resolve();
        });
        connection.once("error", (error) => {
          reject(error instanceof Error ? error : new Error(String(error)));
        });
        connection.once("end", () => {
          reject(Object.assign(new Error("connection closed"), { code: "ECONNREFUSED" }));
        });
      }),
      connectTimeoutMs,
    );
  } catch (error) {
    connection.disconnect();
    // Nothing was sent on a connection that never opened.
    throw Object.assign(error instanceof Error ? error : new Error(String(error)), { code: "ECONNREFUSED" });
  }
  return {
    send: (args, timeoutMs) => within(connection.call(...args), timeoutMs),
    close: () => {
      connection.disconnect();
    },
    get closed() {
      return connection.status === "end" || connection.status === "close";
    },
    unref: () => {
      connection.stream?.unref?.();
    },
  };
}

class IoredisSubscriber implements Subscriber {
  private readonly channels = new Set<string>();
  constructor(
    private readonly connection: IoredisLike,
    private readonly sharded: boolean,
    events: SubscriberEvents,
  ) {
    connection.on("error", quiet);
    const onMessage = (channel: unknown, message: unknown): void => {
      events.message(String(channel), String(message));
    };
    connection.on(sharded ? "smessage" : "message", onMessage);
    let first = true;
    connection.on("ready", () => {
      // After a reconnect ioredis subscribes again: messages may have been missed meanwhile.
      if (!first) for (const channel of this.channels) events.subscribed(channel);
      first = false;
    });
  }
  async subscribe(channel: string): Promise<void> {
    this.channels.add(channel);
    await (this.sharded ? this.connection.ssubscribe(channel) : this.connection.subscribe(channel));
  }
  async unsubscribe(channel: string): Promise<void> {
    this.channels.delete(channel);
    await (this.sharded ? this.connection.sunsubscribe(channel) : this.connection.unsubscribe(channel));
  }
  idle(idle: boolean): void {
    if (idle) this.connection.stream?.unref?.();
    else this.connection.stream?.ref?.();
  }
  close(): void {
    this.connection.disconnect();
  }
}

function subscriberOptions(): object {
  return { autoResubscribe: true, enableOfflineQueue: true, lazyConnect: false, socketTimeout: undefined };
}

class IoredisSingle implements Transport {
  readonly kind = "ioredis";
  readonly cluster = false;
  private readonly once: AtMostOnce;
  constructor(private readonly client: IoredisLike) {
    this.once = new AtMostOnce((_address, timeoutMs) => ioredisOpen(this.client, timeoutMs, timeoutMs));
  }
  sendOnce(_resource: string, args: readonly string[], timeoutMs: number): Promise<unknown> {
    return this.once.send("", args, timeoutMs);
  }
  close(): void {
    this.once.close();
  }
  send(_resource: string, args: readonly string[], timeoutMs: number): Promise<unknown> {
    return within(this.client.call(...args), timeoutMs);
  }
  open(_resource: string, connectTimeoutMs: number, commandTimeoutMs: number): Promise<Connection> {
    return ioredisOpen(this.client, connectTimeoutMs, commandTimeoutMs);
  }
  nodeOf(): string {
    return "";
  }
  locate(): Promise<string> {
    return Promise.resolve("");
  }
  subscriber(_resource: string, events: SubscriberEvents): Promise<Subscriber> {
    return Promise.resolve(new IoredisSubscriber(this.client.duplicate(subscriberOptions()), false, events));
  }
}

class IoredisCluster implements Transport {
  readonly kind = "ioredis";
  readonly cluster = true;
  private command: KeyedCommandClass | null = null;
  private readonly once: AtMostOnce;
  constructor(private readonly client: IoredisClusterLike) {
    this.once = new AtMostOnce((address, timeoutMs) => {
      const nodes = this.client.nodes("all");
      const node = nodes.find((n) => `${n.options.host ?? ""}:${String(n.options.port)}` === address);
      const base = node ?? nodes[0];
      if (base === undefined) {
        return Promise.reject(Object.assign(new Error(`dlock: no server known at "${address}"`), { code: "ECONNREFUSED" }));
      }
      // A server the caller's client does not know yet (a redirect's): its settings, that address.
      return ioredisOpen(base, timeoutMs, timeoutMs, node === undefined ? hostPort(address) : undefined);
    });
  }
  async sendOnce(resource: string, args: readonly string[], timeoutMs: number): Promise<unknown> {
    const deadline = performance.now() + timeoutMs;
    const address = await this.locate(resource, timeoutMs);
    if (address === "") {
      throw Object.assign(new Error(`dlock: no primary known for "${resource}"`), { code: "ECONNREFUSED" });
    }
    return sendOnceInCluster(this.once, address, args, Math.max(1, deadline - performance.now()), () => {
      this.client.refreshSlotsCache();
    });
  }
  close(): void {
    this.once.close();
  }

  // ioredis routes a command by the keys its own command table names; dlock's commands are not
  // in it. A Command whose getKeys() answers the resource (the first argument of a lease's
  // commands, the first after numkeys of a set's) is routed like any keyed command, to the
  // primary of the resource's slot.
  private async keyed(resource: string, name: string, args: string[]): Promise<unknown> {
    if (this.command === null) {
      const ioredis = (await import("ioredis")) as unknown as { Command: CommandClass; default?: { Command: CommandClass } };
      const Base = ioredis.Command;
      this.command = class DlockCommand extends Base {
        key = "";
        getKeys(): unknown[] {
          return [this.key];
        }
      };
    }
    const command = new this.command(name, args, { replyEncoding: "utf8" });
    command.key = resource;
    return this.client.sendCommand(command);
  }
  send(resource: string, args: readonly string[], timeoutMs: number): Promise<unknown> {
    const [name, ...rest] = args;
    return within(this.keyed(resource, name ?? "", rest), timeoutMs);
  }
  /** The connection of the primary serving resource (its slot map awaited, at most timeoutMs). */
  private async master(resource: string, timeoutMs: number): Promise<IoredisLike> {
    const key = await this.locate(resource, timeoutMs);
    const masters = this.client.nodes("master");
    const found = masters.find((node) => `${node.options.host ?? ""}:${String(node.options.port)}` === key);
    if (key === "" || found === undefined) {
      this.client.refreshSlotsCache();
      throw Object.assign(new Error(`dlock: no primary known for "${resource}"`), { code: "ECONNREFUSED" });
    }
    return found;
  }
  async open(resource: string, connectTimeoutMs: number, commandTimeoutMs: number): Promise<Connection> {
    return ioredisOpen(await this.master(resource, connectTimeoutMs), connectTimeoutMs, commandTimeoutMs);
  }
  nodeOf(resource: string): string {
    return this.client.slots[keySlot(resource)]?.[0] ?? "";
  }
  async locate(resource: string, timeoutMs: number): Promise<string> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const known = this.nodeOf(resource);
      const left = deadline - performance.now();
      if (known !== "" || left <= 0) return known;
      // A Cluster made a moment ago (or lazily) learns its slot map in the background: start it
      // and wait for the refresh (one in flight is joined), then look again.
      if (this.client.status === "wait") this.client.connect().catch(quiet);
      await within(
        new Promise<void>((resolve) => {
          this.client.refreshSlotsCache(() => {
            resolve();
          });
        }),
        left,
      ).catch(quiet);
      if (this.nodeOf(resource) === "") await sleepFor(Math.min(LOCATE_PAUSE, Math.max(0, deadline - performance.now())));
    }
  }
  async subscriber(resource: string, events: SubscriberEvents, timeoutMs: number): Promise<Subscriber> {
    const master = await this.master(resource, timeoutMs);
    return new IoredisSubscriber(master.duplicate(subscriberOptions()), true, events);
  }
}

/**
 * node-redis settings of dlock's own connections: no socket timeout, no reconnects, nothing
 * queued while not connected; at (host, port) when given.
 */
function nodeRedisOwn(base: NodeRedisClientLike, at?: { host: string; port: number }): object {
  return {
    socket: { ...(base.options?.socket ?? {}), ...(at ?? {}), socketTimeout: undefined, reconnectStrategy: false },
    disableOfflineQueue: true,
  };
}

async function nodeRedisOpen(base: NodeRedisClientLike, connectTimeoutMs: number, at?: { host: string; port: number }): Promise<Connection> {
  const connection = base.duplicate(nodeRedisOwn(base, at));
  connection.on("error", quiet);
  try {
    await within(connection.connect(), connectTimeoutMs);
  } catch (error) {
    connection.destroy();
    throw Object.assign(error instanceof Error ? error : new Error(String(error)), { code: "ECONNREFUSED" });
  }
  return {
    send: (args, timeoutMs) => within(connection.sendCommand([...args]), timeoutMs),
    close: () => {
      if (connection.isOpen) connection.destroy();
    },
    get closed() {
      return !connection.isOpen;
    },
    unref: () => {
      connection.unref();
    },
  };
}

class NodeRedisSubscriber implements Subscriber {
  private readonly channels = new Set<string>();
  private readonly listener: (message: string, channel: string) => void;
  constructor(
    private readonly connection: NodeRedisClientLike,
    private readonly sharded: boolean,
    events: SubscriberEvents,
  ) {
    this.listener = (message, channel) => {
      events.message(channel, message);
    };
    connection.on("error", quiet);
    let first = true;
    connection.on("ready", () => {
      if (!first) for (const channel of this.channels) events.subscribed(channel);
      first = false;
    });
  }
  async subscribe(channel: string): Promise<void> {
    this.channels.add(channel);
    await (this.sharded
      ? this.connection.sSubscribe(channel, this.listener)
      : this.connection.subscribe(channel, this.listener));
  }
  async unsubscribe(channel: string): Promise<void> {
    this.channels.delete(channel);
    await (this.sharded ? this.connection.sUnsubscribe(channel) : this.connection.unsubscribe(channel));
  }
  idle(idle: boolean): void {
    if (idle) this.connection.unref();
    else this.connection.ref();
  }
  close(): void {
    this.connection.destroy();
  }
}

async function nodeRedisSubscriber(
  base: NodeRedisClientLike,
  sharded: boolean,
  events: SubscriberEvents,
  timeoutMs: number,
): Promise<Subscriber> {
  const connection = base.duplicate({ socket: { ...(base.options?.socket ?? {}), socketTimeout: undefined } });
  const subscriber = new NodeRedisSubscriber(connection, sharded, events);
  try {
    await within(connection.connect(), timeoutMs);
  } catch (error) {
    connection.destroy();
    throw error;
  }
  return subscriber;
}

class NodeRedisSingle implements Transport {
  readonly kind = "node-redis";
  readonly cluster = false;
  private readonly once: AtMostOnce;
  constructor(private readonly client: NodeRedisClientLike) {
    this.once = new AtMostOnce((_address, timeoutMs) => nodeRedisOpen(this.client, timeoutMs));
  }
  sendOnce(_resource: string, args: readonly string[], timeoutMs: number): Promise<unknown> {
    return this.once.send("", args, timeoutMs);
  }
  close(): void {
    this.once.close();
  }
  send(_resource: string, args: readonly string[], timeoutMs: number): Promise<unknown> {
    return within(this.client.sendCommand([...args]), timeoutMs);
  }
  open(_resource: string, connectTimeoutMs: number): Promise<Connection> {
    return nodeRedisOpen(this.client, connectTimeoutMs);
  }
  nodeOf(): string {
    return "";
  }
  locate(): Promise<string> {
    return Promise.resolve("");
  }
  subscriber(_resource: string, events: SubscriberEvents, timeoutMs: number): Promise<Subscriber> {
    return nodeRedisSubscriber(this.client, false, events, timeoutMs);
  }
}

class NodeRedisCluster implements Transport {
  readonly kind = "node-redis";
  readonly cluster = true;
  private readonly once: AtMostOnce;
  constructor(private readonly client: NodeRedisClusterLike) {
    this.once = new AtMostOnce(async (address, timeoutMs) => {
      const node = this.client.nodeByAddress.get(address);
      const base = node ?? this.client.masters[0];
      if (base === undefined) {
        throw Object.assign(new Error(`dlock: no server known at "${address}"`), { code: "ECONNREFUSED" });
      }
      // A server the caller's client does not know yet (a redirect's): its settings, that address.
      return nodeRedisOpen(await this.client.nodeClient(base), timeoutMs, node === undefined ? hostPort(address) : undefined);
    });
  }
  async sendOnce(resource: string, args: readonly string[], timeoutMs: number): Promise<unknown> {
    const address = this.nodeOf(resource);
    if (address === "") {
      throw Object.assign(new Error(`dlock: no primary known for "${resource}"`), { code: "ECONNREFUSED" });
    }
    // node-redis reads its slot map again on its own when it meets a MOVED.
    return sendOnceInCluster(this.once, address, args, timeoutMs, () => undefined);
  }
  close(): void {
    this.once.close();
  }
  send(resource: string, args: readonly string[], timeoutMs: number): Promise<unknown> {
    return within(this.client.sendCommand(resource, false, [...args]), timeoutMs);
  }
  private async master(resource: string): Promise<NodeRedisClientLike> {
    const shard = this.client.slots[keySlot(resource)];
    if (shard === undefined) {
      throw Object.assign(new Error(`dlock: no primary known for "${resource}"`), { code: "ECONNREFUSED" });
    }
    return this.client.nodeClient(shard.master);
  }
  async open(resource: string, connectTimeoutMs: number): Promise<Connection> {
    return nodeRedisOpen(await this.master(resource), connectTimeoutMs);
  }
  nodeOf(resource: string): string {
    const master = this.client.slots[keySlot(resource)]?.master;
    return master === undefined ? "" : `${master.host}:${String(master.port)}`;
  }
  locate(resource: string): Promise<string> {
    // A node-redis cluster is given connected: its slot map is known.
    return Promise.resolve(this.nodeOf(resource));
  }
  async subscriber(resource: string, events: SubscriberEvents, timeoutMs: number): Promise<Subscriber> {
    return nodeRedisSubscriber(await this.master(resource), true, events, timeoutMs);
  }
}
