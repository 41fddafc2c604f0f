package dev.dlock;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.cluster.RedisClusterClient;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Objects;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.Callable;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Consumer;
import java.util.function.Supplier;

/**
 * Takes leases on a Redis (or Valkey) server with the dlock module, or on a Redis Cluster, through
 * Lettuce. Safe for concurrent use; make one per application and close it at the end.
 *
 * <pre>{@code
 * try (Locks locks = Locks.connect("redis://127.0.0.1:6379");
 *      Lease lease = locks.hold("invoice:42", HoldOptions.defaults().ttl(Duration.ofSeconds(30)))) {
 *     pay(lease.fence()); // send the fence with every write the lease protects
 *     lease.check();      // throws LeaseLostException once the lease is gone
 * }
 * }</pre>
 *
 * It follows the client contract ({@code docs/protocol.md} in the repository): a token made before
 * the first send and reused for ambiguous retries; a wait on a connection of its own whose command
 * timeout is above the wait, always with a claim window; renewal with the grant's fence every ttl/3
 * against a conservative local expiry, on one scheduler thread for all leases; a bounded release
 * that never masks the work's own exception; the release of an attempt's token when its outcome
 * stayed unknown.
 */
public final class Locks implements AutoCloseable {
    static final System.Logger LOG = System.getLogger("dev.dlock");
    private static final SecureRandom RANDOM = new SecureRandom();
    /** An observer reads DLOCK.INFO this often besides on every message (a DEL publishes nothing). */
    private static final Duration OBSERVE_INTERVAL = Duration.ofSeconds(5);
    /** A campaign waits in rounds of this length, each with a fresh token. */
    private static final Duration CAMPAIGN_ROUND = Duration.ofSeconds(30);

    private final Transport transport;
    private final ScheduledExecutorService scheduler;
    private final ExecutorService background;
    private final ExecutorService callbacks; // completes whenLost: the caller's callbacks never run on Lettuce's I/O threads
    private final Set<Lease> live = ConcurrentHashMap.newKeySet();
    private volatile boolean closed;
    private final Set<String> refused = ConcurrentHashMap.newKeySet();
    private volatile Metrics metrics = Metrics.NONE;

    private Locks(Transport transport) {
        this.transport = transport;
        ScheduledThreadPoolExecutor renewals = new ScheduledThreadPoolExecutor(1, daemons("dlock-renewals"));
        renewals.setRemoveOnCancelPolicy(true);
        this.scheduler = renewals;
        this.background = Executors.newCachedThreadPool(daemons("dlock-worker"));
        this.callbacks = Executors.newCachedThreadPool(daemons("dlock-callbacks"));
    }

    private static ThreadFactory daemons(String name) {
        AtomicInteger count = new AtomicInteger();
        return runnable -> {
            Thread thread = new Thread(runnable, name + "-" + count.incrementAndGet());
            thread.setDaemon(true);
            return thread;
        };
    }

    /**
     * Locks on a single server (or a Sentinel-managed primary) through the caller's Lettuce
     * client: its resources and options are shared; dlock opens connections of its own to
     * {@code uri} (its credentials, database and TLS) for waits. Closing the Locks leaves the
     * client open.
     *
     * @param client the caller's client
     * @param uri the server
     * @return the Locks
     */
    public static Locks create(RedisClient client, RedisURI uri) {
        return new Locks(new Transport(Objects.requireNonNull(client), Objects.requireNonNull(uri), false));
    }

    /**
     * Locks on a Redis Cluster through the caller's Lettuce cluster client (its slot map routes
     * every command); dlock's own connections to the nodes take the credentials and TLS of
     * {@code seed}. Closing the Locks leaves the client open.
     *
     * @param client the caller's cluster client
     * @param seed one of the cluster's URIs
     * @return the Locks
     */
    public static Locks create(RedisClusterClient client, RedisURI seed) {
        return new Locks(new Transport(Objects.requireNonNull(client), Objects.requireNonNull(seed), false));
    }

    /**
     * Locks with a Lettuce client of their own, closed with them: {@code redis://host:port} (with
     * user and password if needed, {@code rediss://} for TLS) for a single server, or several such
     * URIs separated by commas for a cluster's seeds.
     *
     * @param url one URI, or a cluster's seeds separated by commas
     * @return the Locks
     */
    public static Locks connect(String url) {
        String[] parts = url.split(",");
        List<RedisURI> uris = new ArrayList<>();
        for (String part : parts) {
            uris.add(RedisURI.create(part.trim()));
        }
        if (uris.size() == 1) {
            return new Locks(new Transport(RedisClient.create(), uris.get(0), true));
        }
        return new Locks(new Transport(RedisClusterClient.create(uris), uris.get(0), true));
    }

    /**
     * Sends this Locks' figures to {@code metrics} (default: nowhere).
     *
     * @param metrics where the figures go
     * @return this
     */
    public Locks withMetrics(Metrics metrics) {
        this.metrics = Objects.requireNonNull(metrics);
        return this;
    }

    /**
     * Acquires an exclusive lease on the resource, waiting in the server's queue up to the
     * options' wait, and keeps it renewed until it is closed or lost.
     *
     * @param resource the lock's key (in a cluster, a hash tag puts it beside the data it guards)
     * @param options the hold's options
     * @return the granted lease
     * @throws NotAcquiredException if nothing was granted
     * @throws ServerErrorException if the server refused the request
     */
    public Lease hold(String resource, HoldOptions options) {
        return acquire(resource, false, 0, options);
    }

    /**
     * {@link #hold(String, HoldOptions)} with the default options.
     *
     * @param resource the lock's key
     * @return the granted lease
     */
    public Lease hold(String resource) {
        return hold(resource, HoldOptions.defaults());
    }

    /**
     * {@link #hold(String, HoldOptions)} on a thread of this Locks: the stage completes with the
     * lease or fails with the exception {@code hold} would throw. Cancelling the future interrupts
     * the attempt, which then releases whatever its token may have been granted.
     *
     * @param resource the lock's key
     * @param options the hold's options
     * @return the lease, later
     */
    public CompletableFuture<Lease> holdAsync(String resource, HoldOptions options) {
        CompletableFuture<Lease> result = new CompletableFuture<>();
        java.util.concurrent.Future<?> task = background.submit(() -> {
            try {
                Lease lease = hold(resource, options);
                if (!result.complete(lease)) {
                    // Cancelled as it was granted: nobody holds the lease to close it, so it goes now
                    // (else its renewals would keep it for ever).
                    Thread.interrupted(); // the cancel's interrupt, not a reason to give up the release
                    try {
                        lease.release();
                    } catch (DlockException e) {
                        // Logged and counted by release; a lease not released ends with its ttl.
                    }
                }
            } catch (Throwable e) {
                result.completeExceptionally(e);
            }
        });
        result.whenComplete((value, failure) -> {
            if (result.isCancelled()) {
                task.cancel(true);
            }
        });
        return result;
    }

    /**
     * The writer's side of a read-write lock: an exclusive lease, the one {@link #read} shares.
     *
     * @param resource the lock's key
     * @param options the hold's options
     * @return the granted lease
     */
    public Lease write(String resource, HoldOptions options) {
        return hold(resource, options);
    }

    /**
     * The reader's side of a read-write lock: a shared lease ({@code SHARED}), held together with
     * other readers, never with a writer; each reader has its own token, fence and renewals.
     *
     * @param resource the lock's key
     * @param options the hold's options
     * @return the granted lease
     */
    public Lease read(String resource, HoldOptions options) {
        return acquire(resource, true, 0, options);
    }

    /**
     * One permit of the counting semaphore {@code name} ({@code SHARED LIMIT permits}): granted only
     * while fewer than {@code permits} live. Every user of the semaphore must give the same number.
     *
     * @param name the semaphore's key
     * @param permits from 1 to {@link Protocol#MAX_PERMITS}
     * @param options the hold's options
     * @return the granted permit
     */
    public Lease semaphore(String name, int permits, HoldOptions options) {
        if (permits < 1 || permits > Protocol.MAX_PERMITS) {
            throw new IllegalArgumentException("permits must be from 1 to " + Protocol.MAX_PERMITS + ", not " + permits);
        }
        return acquire(name, true, permits, options);
    }

    /**
     * Acquires an exclusive lease on every one of {@code resources} ({@code DLOCK.ACQUIREALL}), or
     * on none: one token, a fence per member, and keeps the set renewed until it is closed or lost.
     * The set is one lease: the loss of any member (a refused renewal, a revocation, ...) is the
     * loss of the whole set. With a wait (the options' wait; {@link HoldOptions#waitForever()}: no
     * limit) the set takes a ticket in the line of every member, holding nothing meanwhile, first
     * come first served with single leases (a single request that comes later waits behind it), and
     * asks again on any message of a member's channel and every third of its ticket's life (the
     * wait, 1 s to 30 s). The options' tickets or blocking choice does not apply; {@code META} is
     * stored with every member.
     *
     * <pre>{@code
     * try (SetLease set = locks.holdAll(List.of("{acct}:alice", "{acct}:bob"), HoldOptions.defaults())) {
     *     transfer(set.fence("{acct}:alice"), set.fence("{acct}:bob"));
     * }
     * }</pre>
     *
     * @param resources 1 to {@link Protocol#MAX_SET} keys, each once, in the order their fences
     *     come (in a cluster all in one slot: give them a common hash tag)
     * @param options the hold's options
     * @return the granted set
     * @throws IllegalArgumentException if the set is empty, too large, or names a resource twice
     * @throws NotAcquiredException if nothing was granted ({@code HELD}: a member stayed held)
     * @throws ServerErrorException if the server refused the request
     */
    public SetLease holdAll(List<String> resources, HoldOptions options) {
        Objects.requireNonNull(resources, "resources");
        Objects.requireNonNull(options, "options");
        if (resources.isEmpty() || resources.size() > Protocol.MAX_SET) {
            throw new IllegalArgumentException("a set has 1 to " + Protocol.MAX_SET + " resources, not " + resources.size());
        }
        Set<String> seen = new java.util.HashSet<>();
        for (String resource : resources) {
            if (!seen.add(Objects.requireNonNull(resource, "resource"))) {
                throw new IllegalArgumentException("resource '" + resource + "' appears twice in the set");
            }
        }
        metrics.acquireAttempt();
        Attempt attempt = new Attempt(this, resources, options);
        Lease lease = attempt.run();
        metrics.acquired(Duration.ofNanos(System.nanoTime() - attempt.started));
        log(Protocol.LogLine.LEASE_ACQUIRED, "resource", lease.name(), "owner", lease.token(),
                "fence", lease.fenceName(), "mode", "exclusive");
        return new SetLease(this, resources, lease);
    }

    /**
     * {@link #holdAll(List, HoldOptions)} with the default options.
     *
     * @param resources the set's keys
     * @return the granted set
     */
    public SetLease holdAll(List<String> resources) {
        return holdAll(resources, HoldOptions.defaults());
    }

    /**
     * Runs the work under a set ({@link #holdAll(List, HoldOptions)}) and releases it after, with
     * {@link #run(String, HoldOptions, LeaseWork)}'s rules.
     *
     * @param <T> the work's result
     * @param resources the set's keys
     * @param options the hold's options
     * @param work the protected work
     * @return the work's result
     * @throws Exception the work's own exception, as it was thrown
     */
    public <T> T runAll(List<String> resources, HoldOptions options, SetWork<T> work) throws Exception {
        return holdAll(resources, options).run(work);
    }

    /** Work that runs under a set of leases and may use it. */
    @FunctionalInterface
    public interface SetWork<T> {
        /**
         * The work.
         *
         * @param set the set it runs under
         * @return its result
         * @throws Exception whatever the work throws
         */
        T call(SetLease set) throws Exception;
    }

    /** Work that runs under a lease and may use it. */
    @FunctionalInterface
    public interface LeaseWork<T> {
        /**
         * The work.
         *
         * @param lease the lease it runs under
         * @return its result
         * @throws Exception whatever the work throws
         */
        T call(Lease lease) throws Exception;
    }

    /**
     * Runs the work under an exclusive lease and releases it after. The work's thread is
     * interrupted the moment the lease is lost. The work's own exception is what the caller gets
     * (a loss meanwhile is added to it as suppressed); when the work succeeded, a loss throws
     * {@link LeaseLostException} and a failed release {@link NotReleasedException}: a loss is never
     * hidden.
     *
     * @param <T> the work's result
     * @param resource the lock's key
     * @param options the hold's options
     * @param work the protected work
     * @return the work's result
     * @throws Exception the work's own exception, as it was thrown
     */
    public <T> T run(String resource, HoldOptions options, Callable<T> work) throws Exception {
        return run(resource, options, lease -> work.call());
    }

    /**
     * {@link #run(String, HoldOptions, Callable)} with work that gets the lease (its fence).
     *
     * @param <T> the work's result
     * @param resource the lock's key
     * @param options the hold's options
     * @param work the protected work
     * @return the work's result
     * @throws Exception the work's own exception, as it was thrown
     */
    public <T> T run(String resource, HoldOptions options, LeaseWork<T> work) throws Exception {
        return hold(resource, options).run(work);
    }

    /**
     * Campaigns for the leadership of the election {@code name}: waits until this candidate leads,
     * then returns the leadership as an exclusive lease whose {@code META} is {@code address} (what
     * {@link #observe} shows); its fence is the term's epoch. It waits in rounds of 30 s, each with
     * a fresh token, up to the options' wait (for ever with {@link HoldOptions#waitForever()}).
     * Resign by closing the lease.
     *
     * @param name the election's key
     * @param address how others reach this candidate
     * @param options the hold's options (a ttl of 10 s suits most elections)
     * @return the leadership
     */
    public Lease campaign(String name, String address, HoldOptions options) {
        Duration wait = options.waitLimit();
        long until = wait == null ? Long.MAX_VALUE : System.nanoTime() + wait.toNanos();
        while (true) {
            long left = until == Long.MAX_VALUE ? CAMPAIGN_ROUND.toNanos() : Math.max(0, until - System.nanoTime());
            HoldOptions round = options.meta(address).waitFor(Duration.ofNanos(Math.min(left, CAMPAIGN_ROUND.toNanos())));
            try {
                return acquire(name, false, 0, round);
            } catch (NotAcquiredException e) {
                if (e.outcome() != NotAcquiredException.Outcome.HELD || System.nanoTime() - until >= 0
                        || Thread.currentThread().isInterrupted()) {
                    throw e;
                }
            }
        }
    }

    /**
     * Reports the leaders of the election {@code name} as they change: first the one leading now,
     * then each new one, empty while nobody leads. It reads {@code DLOCK.INFO} on every message of
     * the name's channel, on every (re)subscription and every 5 s, on a thread of this Locks, until
     * the returned handle is closed.
     *
     * @param name the election's key
     * @param leaders called with each change
     * @return closing it stops the observation
     */
    public AutoCloseable observe(String name, Consumer<Optional<Leader>> leaders) {
        java.util.concurrent.Future<?> task = background.submit(() -> {
            Channels channels = null;
            Channels.Watch watch = null;
            Optional<Leader> last = null;
            try {
                while (!Thread.currentThread().isInterrupted()) {
                    if (watch == null) {
                        try {
                            channels = transport.channels(name);
                            watch = channels.join(name, null, Duration.ofSeconds(2));
                        } catch (RuntimeException e) {
                            channels = null;
                        }
                    }
                    try {
                        Optional<Leader> leader = Protocol.leaderFromInfo(transport.call(Protocol.infoArgs(name), Duration.ofSeconds(2)));
                        if (!leader.equals(last)) {
                            last = leader;
                            leaders.accept(leader);
                        }
                    } catch (InterruptedException e) {
                        return;
                    } catch (Exception e) {
                        LOG.log(System.Logger.Level.DEBUG, "dlock: observe {0}: {1}", name, e.toString());
                    }
                    if (watch != null) {
                        watch.await(OBSERVE_INTERVAL);
                    } else {
                        Thread.sleep(OBSERVE_INTERVAL.toMillis());
                    }
                }
            } catch (InterruptedException e) {
                // closed
            } finally {
                if (watch != null) {
                    channels.leave(watch);
                }
            }
        });
        return () -> task.cancel(true);
    }

    /**
     * Runs a command in the server only if {@code fence} still holds the resource
     * ({@code DLOCK.FENCED}), atomically. In Redis Cluster every key of the command must hash to
     * the resource's slot. Never retried: a retried write after a lost reply could run twice.
     *
     * @param resource the lock's key
     * @param fence the lease's fence
     * @param command the command and its arguments
     * @return the command's reply (null, Long, String, List, or a Map for a RESP3 map)
     * @throws StaleFenceException if the fence no longer holds: nothing ran
     * @throws ServerErrorException for any other error reply (its class says which)
     */
    public Object fenced(String resource, long fence, List<String> command) {
        try {
            return transport.callOnce(resource, Protocol.fencedArgs(resource, fence, command), HoldOptions.defaults().requestTimeoutValue());
        } catch (Exception e) {
            String reply = Transport.errorReply(e);
            if (reply != null && Protocol.errorClass(reply) == ErrorClass.STALE) {
                metrics.staleWrite();
                log(Protocol.LogLine.STALE_REJECTED, "resource", resource, "fence", Long.toUnsignedString(fence), "reason", reply);
                throw new StaleFenceException(resource, fence, reply);
            }
            throw failure(e);
        }
    }

    /**
     * Whether {@code fence} still holds the resource on the server ({@code DLOCK.FENCECHECK}).
     *
     * @param resource the lock's key
     * @param fence a fence
     * @return true while it holds
     */
    public boolean fenceCheck(String resource, long fence) {
        try {
            return Long.valueOf(1).equals(transport.call(Protocol.fenceCheckArgs(resource, fence),
                    HoldOptions.defaults().requestTimeoutValue()));
        } catch (Exception e) {
            throw failure(e);
        }
    }

    /**
     * What {@code DLOCK.INFO} shows of the resource.
     *
     * @param resource the lock's key
     * @return its state, or empty when nobody holds or waits
     */
    public Optional<Info> info(String resource) {
        try {
            return Protocol.parseInfo(transport.call(Protocol.infoArgs(resource), HoldOptions.defaults().requestTimeoutValue()));
        } catch (Exception e) {
            throw failure(e);
        }
    }

    /** A failure as this client's exception: a server's error reply with its class, else a DlockException. */
    static DlockException failure(Throwable e) {
        String reply = Transport.errorReply(e);
        if (reply != null) {
            return new ServerErrorException(reply);
        }
        if (e instanceof DlockException dlock) {
            return dlock;
        }
        if (e instanceof InterruptedException) {
            Thread.currentThread().interrupt();
        }
        Throwable cause = Transport.unwrap(e);
        return new DlockException("dlock: request failed: " + cause, cause);
    }

    /**
     * Closes dlock's own connections (and its client, if {@link #connect} made it). Leases still
     * held are lost first ({@link LossReason#UNREACHABLE}: nothing renews them any more), which
     * interrupts their {@link Lease#run} work and completes their {@link Lease#whenLost()}, and
     * released (with FENCE, waiting at most their release timeout).
     */
    @Override
    public void close() {
        closed = true;
        List<CompletableFuture<?>> releases = new ArrayList<>();
        for (Lease lease : List.copyOf(live)) {
            releases.add(lease.closedWithLocks());
        }
        try {
            CompletableFuture.allOf(releases.toArray(CompletableFuture[]::new)).get(
                    releases.isEmpty() ? 0 : HoldOptions.defaults().requestTimeoutValue().toMillis(),
                    java.util.concurrent.TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (Exception e) {
            // Each release failure was logged; such a lease ends with its ttl.
        }
        scheduler.shutdownNow();
        background.shutdownNow();
        callbacks.shutdown(); // the losses' callbacks still run
        transport.close();
    }

    void track(Lease lease) {
        live.add(lease);
        if (closed) {
            lease.closedWithLocks(); // granted as the Locks closed
        }
    }

    void untrack(Lease lease) {
        live.remove(lease);
    }

    java.util.concurrent.Executor callbacks() {
        return callbacks;
    }

    // ---- shared by Attempt and Lease ----

    Transport transport() {
        return transport;
    }

    ScheduledExecutorService scheduler() {
        return scheduler;
    }

    Metrics metrics() {
        return metrics;
    }

    /** Writes one of the contract's log lines with its fields (key, value, ...). */
    static void log(Protocol.LogLine line, Object... keysAndValues) {
        if (LOG.isLoggable(line.level)) {
            LOG.log(line.level, line.format(keysAndValues));
        }
    }

    static String newToken() {
        byte[] bytes = new byte[16];
        RANDOM.nextBytes(bytes);
        return HexFormat.of().formatHex(bytes);
    }

    private Lease acquire(String resource, boolean shared, int permits, HoldOptions options) {
        Objects.requireNonNull(resource, "resource");
        Objects.requireNonNull(options, "options");
        metrics.acquireAttempt();
        Attempt attempt = new Attempt(this, resource, shared, permits, options);
        Lease lease = attempt.run();
        metrics.acquired(Duration.ofNanos(System.nanoTime() - attempt.started));
        log(Protocol.LogLine.LEASE_ACQUIRED, "resource", resource, "owner", lease.token(),
                "fence", Long.toUnsignedString(lease.fence()), "mode", shared ? "shared" : "exclusive");
        return lease;
    }

    /**
     * Sends the command build makes; when the server refuses an option as unknown (an older module)
     * that may be dropped (CLAIM, META, FENCE), it is not sent again by this Locks and the command
     * goes once more without it.
     */
    Object call(Supplier<List<String>> build, Duration timeout) throws Exception {
        while (true) {
            List<String> args = build.get();
            try {
                return transport.call(args, timeout);
            } catch (Exception e) {
                if (!dropRefused(args, e)) {
                    throw e;
                }
            }
        }
    }

    /** Whether the failure refused an option of args that can be left out; it is then remembered. */
    boolean dropRefused(List<String> args, Throwable failure) {
        Optional<String> option = Protocol.unsupportedOption(Transport.errorReply(failure));
        if (option.isEmpty() || !Protocol.droppable(option.get())) {
            return false;
        }
        return refused.add(args.get(0) + " " + option.get());
    }

    boolean isRefused(String command, String option) {
        return refused.contains(command + " " + option);
    }

    long fenceArg(String command, long fence) {
        return isRefused(command, "FENCE") ? 0 : fence;
    }
}
