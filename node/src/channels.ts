// The resources' channels: one subscriber per server, shared by every ticket waiter and
// observer of that server, open while anyone watches. A message only wakes: whoever waits sends
// its ACQUIRE again (or reads DLOCK.INFO again), so a lost message costs one refresh, never a
// grant.

import type { Subscriber, Transport } from "./adapters.js";
import { channelName, wakes } from "./protocol.js";

/** One waiter's (or observer's) registration on a channel. */
export class Watch {
  private woken = false;
  private wakeUp: (() => void) | null = null;
  constructor(
    readonly channel: string,
    /** null: an observer, woken by every message. */
    readonly tag: string | null,
    readonly node: string,
  ) {}

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
   * Registers a watch on resource's channel, on the server serving it now, and resolves once the
   * subscription is confirmed (or the timeout passed: the watcher's own refreshes cover that).
   */
  async join(resource: string, tag: string | null): Promise<Watch> {
    const address = this.transport.nodeOf(resource);
    const channel = channelName(resource);
    const watch = new Watch(channel, tag, address);
    let node = this.nodes.get(address);
    if (node === undefined) {
      const made: Node = {
        watches: new Map(),
        subscriber: this.transport.subscriber(
          resource,
          {
            message: (on, message) => {
              for (const w of made.watches.get(on) ?? []) if (wakes(message, w.tag)) w.wake();
            },
            subscribed: (on) => {
              for (const w of made.watches.get(on) ?? []) w.wake();
            },
          },
          this.timeoutMs,
        ),
      };
      made.subscriber.catch(() => undefined);
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
      const subscribed = node.subscriber.then((subscriber) => subscriber.subscribe(channel));
      await Promise.race([
        subscribed.catch(() => undefined),
        new Promise((resolve) => setTimeout(resolve, this.timeoutMs)),
      ]);
    }
    return watch;
  }

  leave(watch: Watch): void {
    const node = this.nodes.get(watch.node);
    const watchers = node?.watches.get(watch.channel);
    if (node === undefined || watchers === undefined) return;
    watchers.delete(watch);
    if (watchers.size > 0) return;
    node.watches.delete(watch.channel);
    if (node.watches.size === 0) {
      this.nodes.delete(watch.node);
      node.subscriber.then((subscriber) => {
        subscriber.close();
      }, () => undefined);
      return;
    }
    node.subscriber.then((subscriber) => subscriber.unsubscribe(watch.channel)).catch(() => undefined);
  }

  close(): void {
    for (const node of this.nodes.values()) {
      node.subscriber.then((subscriber) => {
        subscriber.close();
      }, () => undefined);
    }
    this.nodes.clear();
  }
}
