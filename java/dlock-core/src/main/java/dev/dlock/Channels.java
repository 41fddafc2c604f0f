package dev.dlock;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisConnectionException;
import io.lettuce.core.RedisURI;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.pubsub.RedisPubSubListener;
import io.lettuce.core.pubsub.StatefulRedisPubSubConnection;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.Consumer;
import java.util.function.Function;

/**
 * The resources' channels of one server: one pub/sub connection shared by every ticket waiter,
 * observer and held lease there (SSUBSCRIBE in a cluster, SUBSCRIBE on a single server), open while
 * anyone watches and {@link #IDLE_CLOSE} after (a loop of holds reuses it instead of connecting
 * for each). A message only wakes: whoever waits re-sends its ACQUIRE (or reads DLOCK.INFO again),
 * so a lost message costs one refresh, never a grant. The one message that does more is a
 * revocation ({@code revoked <fence> <reason>}): the held lease with that fence is lost at once
 * ({@code docs/protocol.md}, section 4; one that is missed is caught by the lease's next renewal).
 * A ticket's own channel ({@link #joinOwn}) is watched the same way, in the resource's slot: its
 * {@code granted} message is kept on the watch for the waiter to start on (a missed one costs a
 * refresh, whose ACQUIRE claims the turn).
 * Lettuce re-subscribes after a reconnection; every (re)subscription wakes the channel's watchers,
 * since messages may have been missed.
 *
 * <p>In a cluster a channel follows its slot: when the server drops a subscription that nobody
 * left (the slot moved away: it sends {@code sunsubscribe}), the slot map is read again and the
 * channel's watches move to the channels of the slot's new primary, which subscribes there (a
 * (re)subscription, which wakes them); while the map still names this node, the channel is
 * subscribed here again, retried every 100 ms doubling to 1 s until a node accepts it. A watch
 * that moved leaves where it is now, whichever {@code Channels} it is left through.
 */
final class Channels {
    /** How long the connection stays open once nobody watches. */
    static final Duration IDLE_CLOSE = Duration.ofSeconds(30);

    private final RedisClient client;
    private final RedisURI uri;
    private final boolean sharded;
    private StatefulRedisPubSubConnection<String, String> connection; // open, or null
    private CompletableFuture<StatefulRedisPubSubConnection<String, String>> opening; // being opened, or null
    private Future<?> idleClose;
    private final Map<String, Set<Watch>> watches = new HashMap<>();
    /** Our own (S)UNSUBSCRIBEs not yet confirmed, per channel: any other is the server dropping the channel. */
    private final Map<String, Integer> leaving = new HashMap<>();
    /** In a cluster: the channels of the primary serving a resource's slot, read again; null on a single server. */
    private final Function<String, Channels> owner;
    private boolean closed;
    /**
     * Per watched channel: completes when the server confirmed its (S)SUBSCRIBE, which every joiner
     * waits for; fails if the connection could not be opened.
     */
    private final Map<String, CompletableFuture<Void>> subscribed = new HashMap<>();

    /** A watch, and the channels it was joined through (where {@link #leave()} leaves it). */
    record Joined(Channels channels, Watch watch) {
        void leave() {
            channels.leave(watch);
        }
    }

    /**
     * What wakes a waiter: set by a message to any of the watches that share it (a set's waiter
     * watches every member's channel with one signal), cleared by the wait it ends.
     */
    static final class Signal {
        private boolean woken;

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

    /**
     * One registration: a waiter's or observer's, woken by the messages that concern it, or a held
     * lease's, told of a revocation of its fence.
     */
    static final class Watch {
        final String resource;
        final String channel;
        final String tag; // null: an observer, a set's waiter (woken by every message), or a lease (never woken)
        final long fence; // a lease's
        final Consumer<String> revoked; // a lease's: called with the revocation's reason; null for others
        private final Signal signal;
        volatile Channels home; // where it is registered (it moves with its slot)
        volatile boolean left;
        /** On a ticket's own channel: the last {@code granted} message heard, or null. */
        volatile Protocol.Granted granted;

        Watch(String resource, String channel, String tag, Signal signal) {
            this(resource, channel, tag, 0, null, signal);
        }

        Watch(String resource, String channel, String tag, long fence, Consumer<String> revoked, Signal signal) {
            this.resource = resource;
            this.channel = channel;
            this.tag = tag;
            this.fence = fence;
            this.revoked = revoked;
            this.signal = signal;
        }

        void signal() {
            signal.signal();
        }

        /** Waits until signalled or the timeout passed; clears the signal. */
        boolean await(Duration timeout) throws InterruptedException {
            return signal.await(timeout);
        }
    }

    Channels(RedisClient client, RedisURI uri, boolean sharded, Function<String, Channels> owner) {
        this.client = client;
        this.uri = uri;
        this.sharded = sharded;
        this.owner = owner;
    }

    /**
     * Registers a watch on the resource's channel; returns once the server confirmed the
     * subscription (or timeout passed). Throws a RedisConnectionException if the connection could
     * not be opened within the URI's connect timeout (the watch is then not registered). The first
     * joiner of a channel sends the (S)SUBSCRIBE; a joiner that comes while it is pending waits for
     * the same confirmation (a message published before it would be missed).
     */
    Watch join(String resource, String tag, Duration timeout) {
        return join(resource, tag, timeout, new Signal());
    }

    /** {@link #join(String, String, Duration)} with a signal that other watches may share. */
    Watch join(String resource, String tag, Duration timeout, Signal signal) {
        return join(new Watch(resource, Protocol.channelName(resource), tag, signal), timeout);
    }

    /**
     * {@link #join(String, String, Duration)} on a ticket's own channel
     * ({@link Protocol#ticketChannelName}), where the server tells the ticket of {@code token}
     * alone of its grant: the watch keeps the last {@code granted} message heard there.
     */
    Watch joinOwn(String resource, String token, Duration timeout, Signal signal) {
        return join(new Watch(resource, Protocol.ticketChannelName(resource, token), Protocol.tokenTag(token), signal), timeout);
    }

    private Watch join(Watch watch, Duration timeout) {
        CompletableFuture<?> open;
        CompletableFuture<Void> confirmed;
        synchronized (this) {
            open = register(watch);
            confirmed = subscribed.get(watch.channel);
        }
        try {
            awaitOpen(open);
        } catch (RedisConnectionException e) {
            leave(watch);
            throw e;
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

    /**
     * Registers a held lease's watch on the resource's channel and returns at once, without waiting
     * for the connection or the subscription (a revocation that races them is caught by the lease's
     * next renewal). {@code revoked} is called with the reason of a revocation of {@code fence}, on
     * Lettuce's I/O thread.
     */
    synchronized Watch hold(String resource, long fence, Consumer<String> revoked) {
        Watch watch = new Watch(resource, Protocol.channelName(resource), null, fence, revoked, new Signal());
        register(watch);
        return watch;
    }

    /**
     * Adds the watch; the first of its channel sends the (S)SUBSCRIBE, or opens the connection,
     * which subscribes every watched channel once open. Returns what opens the connection.
     */
    private CompletableFuture<?> register(Watch watch) {
        watch.home = this;
        if (idleClose != null) {
            idleClose.cancel(false);
            idleClose = null;
        }
        Set<Watch> registered = watches.get(watch.channel);
        if (registered == null) {
            registered = new HashSet<>();
            watches.put(watch.channel, registered);
            subscribed.put(watch.channel, new CompletableFuture<>());
            if (connection != null) {
                subscribe(watch.channel); // under the lock: in order with the leaves' UNSUBSCRIBEs
            }
        }
        registered.add(watch);
        if (connection != null) {
            return CompletableFuture.completedFuture(connection);
        }
        if (opening != null) {
            return opening;
        }
        CompletableFuture<StatefulRedisPubSubConnection<String, String>> connecting =
                client.connectPubSubAsync(StringCodec.UTF8, uri).toCompletableFuture();
        opening = connecting;
        connecting.whenComplete((opened, failure) -> opened(connecting, opened, failure)); // may run now
        return connecting;
    }

    /** Waits for the connection at most the URI's connect timeout (Transport.open's rule). */
    private void awaitOpen(CompletableFuture<?> open) {
        Duration limit = Transport.connectTimeout(uri);
        try {
            open.get(limit.toNanos(), TimeUnit.NANOSECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new RedisConnectionException("dlock: interrupted while connecting to " + uri.getHost() + ":" + uri.getPort(), e);
        } catch (TimeoutException e) {
            throw new RedisConnectionException("dlock: no connection to " + uri.getHost() + ":" + uri.getPort() + " within "
                    + limit.toMillis() + " ms (the RedisURI's timeout)");
        } catch (ExecutionException e) {
            Throwable cause = Transport.unwrap(e);
            if (cause instanceof RedisConnectionException failure) {
                throw failure;
            }
            throw new RedisConnectionException("dlock: cannot connect to " + uri.getHost() + ":" + uri.getPort() + ": " + cause, cause);
        }
    }

    /** The connection opened (or failed): every channel watched now is subscribed on it. */
    private synchronized void opened(CompletableFuture<StatefulRedisPubSubConnection<String, String>> connecting,
            StatefulRedisPubSubConnection<String, String> opened, Throwable failure) {
        if (opening != connecting) {
            if (opened != null) {
                opened.closeAsync(); // closed meanwhile
            }
            return;
        }
        opening = null;
        if (failure != null) {
            // Their watchers' refreshes (or renewals) cover it; the next joiner opens a connection again.
            subscribed.values().forEach(pending -> pending.completeExceptionally(failure));
            subscribed.replaceAll((channel, pending) -> new CompletableFuture<>());
            return;
        }
        connection = opened;
        opened.addListener(new Listener());
        watches.keySet().forEach(this::subscribe);
        if (watches.isEmpty()) {
            closeWhenIdle();
        }
    }

    /**
     * The connection's events. Lettuce passes a cluster's sharded ones ({@code smessage},
     * {@code ssubscribed}, {@code sunsubscribed}) to the plain ones by default, so one method serves
     * both kinds; no pattern is ever subscribed.
     */
    private final class Listener implements RedisPubSubListener<String, String> {
        @Override
        public void message(String channel, String message) {
            deliver(channel, message);
        }

        @Override
        public void subscribed(String channel, long count) {
            deliver(channel, null);
        }

        @Override
        public void unsubscribed(String channel, long count) {
            dropped(channel);
        }

        @Override
        public void message(String pattern, String channel, String message) {}

        @Override
        public void psubscribed(String pattern, long count) {}

        @Override
        public void punsubscribed(String pattern, long count) {}
    }

    /** Sends the (S)SUBSCRIBE of channel (it does not wait); called with the lock held. */
    private void subscribe(String channel) {
        CompletableFuture<Void> done = subscribed.get(channel);
        (sharded ? connection.async().ssubscribe(channel) : connection.async().subscribe(channel))
                .whenComplete((ignored, failure) -> {
                    if (failure != null) {
                        done.completeExceptionally(failure);
                    } else {
                        done.complete(null);
                    }
                });
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
        Optional<Protocol.Revocation> revocation = message == null ? Optional.empty() : Protocol.revocation(message);
        Protocol.Granted granted = message == null ? null : Protocol.granted(message).orElse(null);
        List<Runnable> losses = new ArrayList<>();
        for (Watch watch : targets) {
            if (watch.revoked != null) {
                revocation.filter(r -> r.fence() == watch.fence)
                        .ifPresent(r -> losses.add(() -> watch.revoked.accept(r.reason())));
                continue;
            }
            if (granted != null) {
                watch.granted = granted; // kept before the waiter wakes, so that it reads it
            }
            if (message == null || Protocol.wakes(message, watch.tag)) {
                watch.signal();
            }
        }
        losses.forEach(Runnable::run);
    }

    /**
     * An unsubscription confirmed: ours (a leave), or the server dropping a channel still watched
     * here, whose slot moved away (in a cluster), which the channel then follows.
     */
    private void dropped(String channel) {
        synchronized (this) {
            Integer ours = leaving.remove(channel);
            if (ours != null) {
                if (ours > 1) {
                    leaving.put(channel, ours - 1);
                }
                return;
            }
            if (owner == null || closed || !watches.containsKey(channel)) {
                return;
            }
        }
        java.util.concurrent.ForkJoinPool.commonPool().execute(() -> follow(channel)); // not on Lettuce's I/O thread
    }

    /**
     * Moves the channel's watches to the channels of the primary its slot is on now, or subscribes
     * it here again while the slot map names this node; retried until one of them is done.
     */
    private void follow(String channel) {
        long pauseMs = 100;
        while (true) {
            String resource;
            synchronized (this) {
                Set<Watch> registered = watches.get(channel);
                if (closed || registered == null || registered.isEmpty()) {
                    return; // nobody watches any more
                }
                resource = registered.iterator().next().resource;
            }
            Channels target;
            try {
                target = owner.apply(resource);
            } catch (RuntimeException e) {
                target = null; // no node known for the slot yet
            }
            if (target != null && target != this) {
                Set<Watch> moving;
                synchronized (this) {
                    moving = watches.remove(channel);
                    subscribed.remove(channel);
                    if (moving == null) {
                        return;
                    }
                    for (Watch watch : moving) {
                        watch.home = target;
                    }
                    if (watches.isEmpty() && connection != null) {
                        closeWhenIdle();
                    }
                }
                target.adopt(moving);
                return;
            }
            if (target == this && subscribeAgain(channel)) {
                return;
            }
            try {
                Thread.sleep(pauseMs);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            }
            pauseMs = Math.min(2 * pauseMs, 1000);
        }
    }

    /** The channel subscribed here again (the slot is still here, or came back): true once the server accepted it. */
    private boolean subscribeAgain(String channel) {
        CompletableFuture<Void> done;
        synchronized (this) {
            if (connection == null || !watches.containsKey(channel)) {
                return connection != null || opening != null; // a connection being opened subscribes it
            }
            done = new CompletableFuture<>();
            subscribed.put(channel, done);
            subscribe(channel);
        }
        try {
            done.get(Transport.connectTimeout(uri).toMillis(), TimeUnit.MILLISECONDS);
            return true;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return true;
        } catch (ExecutionException | TimeoutException e) {
            return false; // MOVED: the slot map is behind
        }
    }

    /** Registers watches that moved here with their slot; the first of a channel subscribes it. */
    void adopt(Set<Watch> moving) {
        synchronized (this) {
            for (Watch watch : moving) {
                if (!watch.left && watch.home == this) {
                    register(watch);
                }
            }
        }
    }

    /**
     * Unregisters a watch, where it is registered now (it may have moved with its slot); the last
     * watcher of a channel unsubscribes it (in order with the joins' SUBSCRIBEs); once nobody
     * watches, the connection closes after {@link #IDLE_CLOSE}.
     */
    void leave(Watch watch) {
        while (true) {
            Channels home = watch.home;
            if (home != null && home != this) {
                home.leave(watch);
                return;
            }
            synchronized (this) {
                if (watch.home == home) {
                    watch.left = true;
                    leaveHere(watch);
                    return;
                }
            }
        }
    }

    private void leaveHere(Watch watch) {
        Set<Watch> registered = watches.get(watch.channel);
        if (registered == null || !registered.remove(watch) || !registered.isEmpty()) {
            return;
        }
        watches.remove(watch.channel);
        subscribed.remove(watch.channel);
        if (connection != null) {
            leaving.merge(watch.channel, 1, Integer::sum);
            if (sharded) {
                connection.async().sunsubscribe(watch.channel);
            } else {
                connection.async().unsubscribe(watch.channel);
            }
            if (watches.isEmpty()) {
                closeWhenIdle();
            }
        }
    }

    /** Closes the connection after IDLE_CLOSE unless someone watches again meanwhile; called with the lock held. */
    private void closeWhenIdle() {
        if (idleClose != null) {
            idleClose.cancel(false);
        }
        try {
            idleClose = client.getResources().eventExecutorGroup().schedule(() -> {
                synchronized (this) {
                    if (watches.isEmpty() && connection != null) {
                        connection.closeAsync();
                        connection = null;
                        leaving.clear();
                    }
                }
            }, IDLE_CLOSE.toMillis(), TimeUnit.MILLISECONDS);
        } catch (java.util.concurrent.RejectedExecutionException e) {
            // The client is shutting down, and its connections with it.
            connection.closeAsync();
            connection = null;
        }
    }

    synchronized void close() {
        closed = true;
        if (idleClose != null) {
            idleClose.cancel(false);
            idleClose = null;
        }
        if (connection != null) {
            connection.closeAsync();
            connection = null;
        }
        opening = null; // closed once it opens
        watches.clear();
        subscribed.clear();
        leaving.clear();
    }
}
