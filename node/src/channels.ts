// The resources' channels: one subscriber per server, shared by every ticket waiter and
// observer of that server, open while anyone watches. A message only wakes: whoever waits sends
// its ACQUIRE again (or reads DLOCK.INFO again), so a lost message costs one refresh, never a
// grant.

import { performance } from "node:perf_hooks";

import type { Subscriber, Transport } from "./adapters.js";
import { channelName, wakes } from "./protocol.js";

/** One waiter's (or observer's) registration on a channel. */
export class Watch {
  private woken = false;
  private wakeUp: (() => void) | null = null;
  private failed = false;
  constructor(
    readonly channel: string,
    /** null: an observer, woken by every message. */
    readonly tag: string | null,
    readonly node: string,
  ) {}

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

interface Node {
  subscriber: Promise<Subscriber>;
  watches: Map<string, Set<Watch>>;
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
   * marks the watch broken, to be joined again).
   */
  async join(resource: string, tag: string | null): Promise<Watch> {
    const started = performance.now();
    const address = await this.transport.locate(resource, this.timeoutMs);
    const left = (): number => Math.max(1, this.timeoutMs - (performance.now() - started));
    const channel = channelName(resource);
    const watch = new Watch(channel, tag, address);
    let node = this.nodes.get(address);
    if (node === undefined) {
      const made: Node = {
        watches: new Map(),
        // Deferred so that a transport that throws at once rejects instead.
        subscriber: Promise.resolve().then(() =>
          this.transport.subscriber(
            resource,
            {
              message: (on, message) => {
                for (const w of made.watches.get(on) ?? []) if (wakes(message, w.tag)) w.wake();
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
    }
    let watchers = node.watches.get(channel);
    const first = watchers === undefined;
    if (watchers === undefined) {
      watchers = new Set();
      node.watches.set(channel, watchers);
    }
    watchers.add(watch);
    if (first) {
      const on = node;
      const set = watchers;
      const subscribed = node.subscriber.then((subscriber) => subscriber.subscribe(channel));
      subscribed.catch(() => {
        // Not subscribed: whoever joins the channel next subscribes it again.
        if (on.watches.get(channel) === set) on.watches.delete(channel);
        for (const w of set) w.fail();
      });
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        subscribed.catch(() => undefined),
        new Promise((resolve) => {
          timer = setTimeout(resolve, left());
        }),
      ]);
      clearTimeout(timer);
    }
    return watch;
  }

  leave(watch: Watch): void {
    const node = this.nodes.get(watch.node);
    const watchers = node?.watches.get(watch.channel);
    if (node === undefined || watchers === undefined || !watchers.has(watch)) return;
    watchers.delete(watch);
    if (watchers.size > 0) return;
    node.watches.delete(watch.channel);
    if (node.watches.size === 0) {
      this.nodes.delete(watch.node);
      node.subscriber
        .then((subscriber) => {
          subscriber.close();
        })
        .catch(() => undefined);
      return;
    }
    node.subscriber.then((subscriber) => subscriber.unsubscribe(watch.channel)).catch(() => undefined);
  }

  close(): void {
    for (const node of this.nodes.values()) {
      node.subscriber
        .then((subscriber) => {
          subscriber.close();
        })
        .catch(() => undefined);
    }
    this.nodes.clear();
  }
}
