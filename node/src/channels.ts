// The resources' channels: one subscriber per server, shared by every ticket waiter, observer
// and lease holder of that server, open while anyone watches. For waiters and observers a
// message only wakes: whoever waits sends its ACQUIRE again (or reads DLOCK.INFO again), so a
// lost message costs one refresh, never a grant. A holder hears every message itself (a
// `revoked` one with its fence ends its lease); one it misses is caught by its next renewal.

import { performance } from "node:perf_hooks";

import type { Subscriber, Transport } from "./adapters.js";
import { channelName, grantedOf, wakes, type Granted } from "./protocol.js";

/** One waiter's (observer's, holder's) registration on a channel. */
export class Watch {
  private woken = false;
  private wakeUp: (() => void) | null = null;
  private failed = false;
  private addressOf: string;
  private ended = false;
  /** On a ticket's own channel: the last `granted` message heard (kept before the wake). */
  granted: Granted | null = null;
  constructor(
    readonly channel: string,
    /** null: an observer, woken by every message. */
    readonly tag: string | null,
    node: string,
    /** A holder's: told every message of the channel, instead of being woken. */
    private readonly heard: ((message: string) => void) | null = null,
  ) {
    this.addressOf = node;
  }

  /** The server it is (or will be) subscribed on ("" on a single server). */
  get node(): string {
    return this.addressOf;
  }

  /** @internal Where a watch registered before its server was known is subscribed. */
  locatedAt(node: string): void {
    this.addressOf = node;
  }

  /** @internal Left: nothing is registered for it any more. */
  get hasLeft(): boolean {
    return this.ended;
  }

  /** @internal */
  leave(): void {
    this.ended = true;
  }

  /** @internal A message on its channel. */
  hear(message: string): void {
    if (this.heard !== null) {
      this.heard(message);
      return;
    }
    const granted = grantedOf(message);
    if (granted !== null) this.granted = granted;
    if (wakes(message, this.tag)) this.wake();
  }

  /**
   * Its subscription could not be made (no subscriber on the server, or no confirmation): the
   * watcher joins again before its next wait; meanwhile its own refreshes cover it.
   */
  get broken(): boolean {
    return this.failed;
  }

  /** @internal */
  fail(): void {
    this.failed = true;
  }

  /** A message that concerns this watch came, or the channel was (re)subscribed. */
  wake(): void {
    this.woken = true;
    this.wakeUp?.();
  }

  /** Forgets the wakes so far: a message from now on means "send again". */
  drain(): void {
    this.woken = false;
  }

  /** Resolves at the next wake (or one that came since the last drain), after ms, or on abort. */
  next(ms: number, signal?: AbortSignal): Promise<void> {
    if (this.woken || signal?.aborted === true) {
      this.woken = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", done);
        this.wakeUp = null;
        this.woken = false;
        resolve();
      };
      const timer = setTimeout(done, Math.max(0, ms));
      signal?.addEventListener("abort", done, { once: true });
      this.wakeUp = done;
    });
  }
}

/**
 * Resolves at the first wake of any of watches (one that came since its last drain included),
 * after ms, or on abort; the others stop waiting then. For a set, which waits on every member's
 * channel at once.
 */
export async function firstWake(watches: readonly Watch[], ms: number, signal?: AbortSignal): Promise<void> {
  const woken = new AbortController();
  const stop = (): void => {
    woken.abort();
  };
  signal?.addEventListener("abort", stop, { once: true });
  if (signal?.aborted === true) stop();
  try {
    await Promise.race(watches.length === 0 ? [sleepMs(ms, woken.signal)] : watches.map((watch) => watch.next(ms, woken.signal)));
  } finally {
    signal?.removeEventListener("abort", stop);
    woken.abort();
  }
}

function sleepMs(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, Math.max(0, ms));
    signal.addEventListener(
      "abort",
      () => {
        clearTimeout(timer);
        resolve();
      },
      { once: true },
    );
  });
}

/**
 * A subscriber left without channels stays open this long (not keeping the process alive), so
 * that a lease taken right after the last one ended does not open a new connection.
 */
const IDLE_CLOSE = 2_000;

interface Node {
  subscriber: Promise<Subscriber>;
  watches: Map<string, Set<Watch>>;
  /**
   * Unsubscriptions still in flight, by channel: a new subscription to the channel waits for
   * its own (node-redis's Cluster closes a shard's pub/sub client once its last channel is
   * unsubscribed: a subscription sent meanwhile went to the client being closed and was lost).
   */
  leaving: Map<string, Promise<void>>;
  /** Closes the subscriber once idle that long; null while someone watches. */
  idle: NodeJS.Timeout | null;
}

export class Channels {
  private readonly nodes = new Map<string, Node>();
  constructor(
    private readonly transport: Transport,
    private readonly timeoutMs: number,
  ) {}

  /**
   * Registers a watch on resource's channel, on the server serving it (a cluster client still
   * learning its slot map is waited for), and resolves once the subscription is confirmed, or
   * failed, or the timeout passed: the watcher's own refreshes cover the last two (a failed one
   * marks the watch broken, to be joined again). channel: another channel than the resource's,
   * in its slot (a ticket's own, where every message wakes it and a `granted` one is kept).
   */
  async join(resource: string, tag: string | null, channel: string = channelName(resource)): Promise<Watch> {
    const started = performance.now();
    const address = await this.transport.locate(resource, this.timeoutMs);
    const left = (): number => Math.max(1, this.timeoutMs - (performance.now() - started));
    const watch = new Watch(channel, tag, address);
    const subscribed = this.add(resource, watch, left);
    if (subscribed !== null) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        subscribed,
        new Promise((resolve) => {
          timer = setTimeout(resolve, left());
        }),
      ]);
      clearTimeout(timer);
    }
    return watch;
  }

  /**
   * A holder's watch on resource's channel: heard is told every message. Returns at once; the
   * subscription is made in the background, never awaited (a message sent before it is
   * confirmed is missed: the holder's renewals cover that). A failed one marks the watch broken.
   */
  listen(resource: string, heard: (message: string) => void): Watch {
    const started = performance.now();
    const left = (): number => Math.max(1, this.timeoutMs - (performance.now() - started));
    const known = this.transport.nodeOf(resource);
    const watch = new Watch(channelName(resource), null, known, heard);
    if (known !== "" || !this.transport.cluster) {
      void this.add(resource, watch, left);
      return watch;
    }
    // A cluster client that does not know the slot's primary yet: subscribe once it does.
    this.transport
      .locate(resource, this.timeoutMs)
      .then((address) => {
        if (watch.hasLeft) return;
        watch.locatedAt(address);
        void this.add(resource, watch, left);
      })
      .catch(() => {
        watch.fail();
      });
    return watch;
  }

  /**
   * Adds watch to its channel on its server, making the server's subscriber if needed; the
   * channel's subscription (settled: never rejects) when this watch is its first, else null.
   */
  private add(resource: string, watch: Watch, left: () => number): Promise<void> | null {
    const { channel, node: address } = watch;
    let node = this.nodes.get(address);
    if (node === undefined) {
      const made: Node = {
        watches: new Map(),
        leaving: new Map(),
        idle: null,
        // Deferred so that a transport that throws at once rejects instead.
        subscriber: Promise.resolve().then(() =>
          this.transport.subscriber(
            resource,
            {
              message: (on, message) => {
                // A copy: a holder told of its loss leaves the channel meanwhile.
                for (const w of [...(made.watches.get(on) ?? [])]) w.hear(message);
              },
              subscribed: (on) => {
                for (const w of made.watches.get(on) ?? []) w.wake();
              },
            },
            left(),
          ),
        ),
      };
      made.subscriber.catch(() => {
        // No subscriber on that server: its watches are broken, the next join makes a new one.
        if (this.nodes.get(address) === made) this.nodes.delete(address);
        for (const watchers of made.watches.values()) for (const w of watchers) w.fail();
      });
      node = made;
      this.nodes.set(address, node);
    } else if (node.idle !== null) {
      clearTimeout(node.idle);
      node.idle = null;
      node.subscriber
        .then((subscriber) => {
          subscriber.idle(false);
        })
        .catch(() => undefined);
    }
    let watchers = node.watches.get(channel);
    const first = watchers === undefined;
    if (watchers === undefined) {
      watchers = new Set();
      node.watches.set(channel, watchers);
    }
    watchers.add(watch);
    if (!first) return null;
    const on = node;
    const set = watchers;
    const leaving = node.leaving.get(channel) ?? Promise.resolve();
    return leaving
      .then(() => on.subscriber)
      .then((subscriber) => subscriber.subscribe(channel))
      .catch(() => {
        // Not subscribed: whoever joins the channel next subscribes it again.
        if (on.watches.get(channel) === set) on.watches.delete(channel);
        for (const w of set) w.fail();
      });
  }

  leave(watch: Watch): void {
    watch.leave();
    const node = this.nodes.get(watch.node);
    const watchers = node?.watches.get(watch.channel);
    if (node === undefined || watchers === undefined || !watchers.has(watch)) return;
    watchers.delete(watch);
    if (watchers.size > 0) return;
    node.watches.delete(watch.channel);
    const channel = watch.channel;
    const left: Promise<void> = node.subscriber
      .then((subscriber) => subscriber.unsubscribe(channel))
      .catch(() => undefined)
      .finally(() => {
        if (node.leaving.get(channel) === left) node.leaving.delete(channel);
      });
    node.leaving.set(channel, left);
    if (node.watches.size > 0) return;
    // Nobody watches on that server: the subscriber idles a while, then closes.
    const address = watch.node;
    node.subscriber
      .then((subscriber) => {
        if (node.idle !== null) subscriber.idle(true);
      })
      .catch(() => undefined);
    node.idle = setTimeout(() => {
      node.idle = null;
      if (this.nodes.get(address) !== node || node.watches.size > 0) return;
      this.nodes.delete(address);
      node.subscriber
        .then((subscriber) => {
          subscriber.close();
        })
        .catch(() => undefined);
    }, IDLE_CLOSE);
    node.idle.unref();
  }

  close(): void {
    for (const node of this.nodes.values()) {
      if (node.idle !== null) clearTimeout(node.idle);
      node.subscriber
        .then((subscriber) => {
          subscriber.close();
        })
        .catch(() => undefined);
    }
    this.nodes.clear();
  }
}
