package dev.dlock;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.pubsub.RedisPubSubAdapter;
import io.lettuce.core.pubsub.StatefulRedisPubSubConnection;
import java.time.Duration;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/**
 * The resources' channels of one server: one pub/sub connection shared by every ticket waiter and
 * observer there, open while anyone watches (SSUBSCRIBE in a cluster, SUBSCRIBE on a single
 * server). A message only wakes: whoever waits re-sends its ACQUIRE (or reads DLOCK.INFO again),
 * so a lost message costs one refresh, never a grant. Lettuce re-subscribes after a reconnection;
 * every (re)subscription wakes the channel's watchers, since messages may have been missed.
 */
final class Channels {
    private final RedisClient client;
    private final RedisURI uri;
    private final boolean sharded;
    private StatefulRedisPubSubConnection<String, String> connection;
    private final Map<String, Set<Watch>> watches = new HashMap<>();
    /** Per watched channel: completes when the server confirmed its (S)SUBSCRIBE, which every joiner waits for. */
    private final Map<String, CompletableFuture<Void>> subscribed = new HashMap<>();

    /** One waiter's (or observer's) registration: woken by the messages that concern it. */
    static final class Watch {
        final String channel;
        final String tag; // null: an observer
        private boolean woken;

        Watch(String channel, String tag) {
            this.channel = channel;
            this.tag = tag;
        }

        synchronized void signal() {
            woken = true;
            notifyAll();
        }

        /** Waits until signalled or the timeout passed; clears the signal. */
        synchronized boolean await(Duration timeout) throws InterruptedException {
            long deadline = System.nanoTime() + timeout.toNanos();
            while (!woken) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    return false;
                }
                TimeUnit.NANOSECONDS.timedWait(this, left);
            }
            woken = false;
            return true;
        }
    }

    Channels(RedisClient client, RedisURI uri, boolean sharded) {
        this.client = client;
        this.uri = uri;
        this.sharded = sharded;
    }

    /**
     * Registers a watch on the resource's channel; returns once the server confirmed the
     * subscription (or timeout passed). Throws a RedisConnectionException if the connection could
     * not be opened (the watch is then not registered). The first joiner of a channel sends the (S)SUBSCRIBE; a
     * joiner that comes while it is pending waits for the same confirmation (a message published
     * before it would be missed).
     */
    Watch join(String resource, String tag, Duration timeout) {
        Watch watch = new Watch(Protocol.channelName(resource), tag);
        CompletableFuture<Void> confirmed;
        synchronized (this) {
            if (connection == null) {
                // Opened within the URI's connect timeout (Transport.open), whatever the joiner's timeout.
                connection = Transport.open(client.connectPubSubAsync(StringCodec.UTF8, uri), uri);
                connection.addListener(new RedisPubSubAdapter<>() {
                    @Override
                    public void message(String channel, String message) {
                        deliver(channel, message);
                    }

                    @Override
                    public void smessage(String channel, String message) {
                        deliver(channel, message);
                    }

                    @Override
                    public void subscribed(String channel, long count) {
                        deliver(channel, null);
                    }

                    @Override
                    public void ssubscribed(String channel, long count) {
                        deliver(channel, null);
                    }
                });
            }
            if (!watches.containsKey(watch.channel)) {
                // Sent under the lock (it does not wait): in the order of the leaves' UNSUBSCRIBEs.
                CompletableFuture<Void> done = new CompletableFuture<>();
                subscribed.put(watch.channel, done);
                (sharded ? connection.async().ssubscribe(watch.channel) : connection.async().subscribe(watch.channel))
                        .whenComplete((ignored, failure) -> {
                            if (failure != null) {
                                done.completeExceptionally(failure);
                            } else {
                                done.complete(null);
                            }
                        });
            }
            watches.computeIfAbsent(watch.channel, c -> new HashSet<>()).add(watch);
            confirmed = subscribed.get(watch.channel);
        }
        try {
            confirmed.get(timeout.toMillis(), TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (Exception e) {
            // The watcher's own refreshes (every ticket / 3, every observe interval) cover a missed subscription.
        }
        return watch;
    }

    /** message null: a (re)subscription, which wakes every watcher of the channel. */
    private void deliver(String channel, String message) {
        Set<Watch> targets;
        synchronized (this) {
            Set<Watch> registered = watches.get(channel);
            if (registered == null) {
                return;
            }
            targets = new HashSet<>(registered);
        }
        for (Watch watch : targets) {
            if (message == null || Protocol.wakes(message, watch.tag)) {
                watch.signal();
            }
        }
    }

    /** Unregisters a watch; the last watcher of a channel unsubscribes it (in order with the joins' SUBSCRIBEs), the last of all closes the connection. */
    synchronized void leave(Watch watch) {
        Set<Watch> registered = watches.get(watch.channel);
        if (registered == null || !registered.remove(watch) || !registered.isEmpty()) {
            return;
        }
        watches.remove(watch.channel);
        subscribed.remove(watch.channel);
        if (connection == null) {
            return;
        }
        if (watches.isEmpty()) {
            connection.closeAsync();
            connection = null;
        } else if (sharded) {
            connection.async().sunsubscribe(watch.channel);
        } else {
            connection.async().unsubscribe(watch.channel);
        }
    }

    synchronized void close() {
        if (connection != null) {
            connection.closeAsync();
            connection = null;
        }
        watches.clear();
        subscribed.clear();
    }
}
