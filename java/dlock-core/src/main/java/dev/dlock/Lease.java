package dev.dlock;

import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;

/**
 * A granted lease: its token owns the resource with {@link #fence()} until the server's deadline,
 * kept alive by renewals (every ttl/3, with FENCE, on the {@link Locks}' one scheduler thread)
 * until it is closed or lost. Close it with try-with-resources: {@link #close()} releases it, and
 * throws {@link LeaseLostException} if it was lost meanwhile (added as suppressed to the block's
 * own exception, which Java keeps as the one thrown).
 */
public final class Lease implements AutoCloseable {
    /** A lease cut to end with the max hold ends up to this much before it (milliseconds round down). */
    private static final long MAX_HOLD_ROUNDING_NANOS = 2_000_000;

    private final Locks locks;
    private final String resource; // a set's first member (a Cluster routes the set by it)
    private final String token;
    private final long fence; // a set's first member's
    private final List<String> resources; // a set's members, in the caller's order; null for a single lease
    private final long[] fences; // a set's fences, in the resources' order
    private final String name; // as log lines give it: the resource, or a set's members joined by ','
    private final String fenceName; // the fence, or a set's fences joined by ','
    private final boolean shared;
    private final long ttlMs; // as sent: whole milliseconds
    private final HoldOptions options;
    private final long granted = System.nanoTime();
    private final long holdEnd; // nanoTime; 0: none

    private final CompletableFuture<LeaseLostException> lost = new CompletableFuture<>();
    private long localExpiry; // nanoTime: the answered request's send time plus the ttl it carried
    private long nextRenewal;
    private boolean releasing;
    private boolean renewing;
    private boolean renewalUnanswered; // the last RENEW sent got no answer: it failed, timed out or is outstanding
    private ScheduledFuture<?> timer;
    private DlockException released; // the release's failure, once it ran
    private boolean releaseRan;
    private volatile CompletableFuture<?> lossRelease = CompletableFuture.completedFuture(null);
    private List<Channels.Joined> listening = List.of(); // where the lease listens for a revocation until it ends
    /**
     * A lease started on its ticket's {@code granted} message: its claim (a RENEW with the fence,
     * sent at the grant), whose answer the first renewal reads instead of sending its own; null
     * once read, and for any other lease.
     */
    private Claim claim;

    /** A claim sent: its RENEW's answer (or failure), the ttl it carried, and its send time (nanoTime). */
    private record Claim(CompletableFuture<Object> answer, long renewMs, long sent) {}

    Lease(Locks locks, String resource, String token, long fence, boolean shared, long ttlMs, HoldOptions options,
            long sent, long holdEnd) {
        this(locks, resource, null, token, new long[] {fence}, shared, ttlMs, options, sent, holdEnd);
    }

    /**
     * A lease its ticket's own channel announced ({@code granted <fence> <request> <window-ms>}):
     * held from now on until {@code localExpiry} (the named request's send time plus the window),
     * its claim (a RENEW with the fence, which sets the full ttl) sent at once and not awaited;
     * the first renewal, due at once, reads its answer.
     */
    static Lease started(Locks locks, String resource, String token, long fence, boolean shared, long ttlMs,
            HoldOptions options, long localExpiry, long holdEnd) {
        return new Lease(locks, resource, token, fence, shared, ttlMs, options, localExpiry, holdEnd, true);
    }

    private Lease(Locks locks, String resource, String token, long fence, boolean shared, long ttlMs,
            HoldOptions options, long localExpiry, long holdEnd, boolean started) {
        this(locks, resource, null, token, new long[] {fence}, shared, ttlMs, options, localExpiry - ttlMs * 1_000_000,
                holdEnd, started);
    }

    /** The lease of a set ({@code DLOCK.ACQUIREALL}): exclusive, one token, a fence per member. */
    Lease(Locks locks, List<String> resources, String token, long[] fences, long ttlMs, HoldOptions options, long sent,
            long holdEnd) {
        this(locks, resources.get(0), List.copyOf(resources), token, fences.clone(), false, ttlMs, options, sent, holdEnd);
    }

    private Lease(Locks locks, String resource, List<String> resources, String token, long[] fences, boolean shared,
            long ttlMs, HoldOptions options, long sent, long holdEnd) {
        this(locks, resource, resources, token, fences, shared, ttlMs, options, sent, holdEnd, false);
    }

    /** started: a lease started on its ticket's message, whose local expiry is sent plus the ttl until its claim is read. */
    private Lease(Locks locks, String resource, List<String> resources, String token, long[] fences, boolean shared,
            long ttlMs, HoldOptions options, long sent, long holdEnd, boolean started) {
        this.locks = locks;
        this.resource = resource;
        this.resources = resources;
        this.token = token;
        this.fences = fences;
        this.fence = fences[0];
        this.name = resources == null ? resource : String.join(",", resources);
        StringBuilder fenceText = new StringBuilder();
        for (long each : fences) {
            fenceText.append(fenceText.length() == 0 ? "" : ",").append(Long.toUnsignedString(each));
        }
        this.fenceName = fenceText.toString();
        this.shared = shared;
        this.ttlMs = ttlMs;
        this.options = options;
        this.holdEnd = holdEnd;
        synchronized (this) {
            this.localExpiry = Protocol.localExpiry(sent, ttlMs);
            if (started) {
                // The claim goes now, beside the work; the first renewal (due now) reads its answer.
                long renewMs = renewalMs();
                long claimSent = System.nanoTime();
                this.claim = new Claim(locks.transport().send(renewArgs(renewMs), renewalTimeout(claimSent)),
                        renewMs, claimSent);
                this.nextRenewal = claimSent;
            } else {
                this.nextRenewal = sent + Protocol.renewalPeriodNanos(ttlMs);
            }
            schedule();
        }
        locks.track(this);
        listen();
    }

    /**
     * Listens on the resource's channel (a set: every member's) for a revocation of this lease's
     * fence (a member's), without waiting for the subscription ({@code docs/protocol.md}, section
     * 4): one that races it is caught by the next renewal.
     */
    private void listen() {
        List<Channels.Joined> joined = new java.util.ArrayList<>();
        List<String> members = resources == null ? List.of(resource) : resources;
        for (int i = 0; i < members.size(); i++) {
            try {
                Channels on = locks.transport().channels(members.get(i));
                joined.add(new Channels.Joined(on, on.hold(members.get(i), fences[i], this::revoked)));
            } catch (RuntimeException e) {
                // No node known for the slot: the renewals alone tell of a loss.
            }
        }
        boolean ended;
        synchronized (this) {
            ended = releaseRan || lost.isDone();
            if (!ended) {
                listening = joined;
            }
        }
        if (ended) {
            joined.forEach(Channels.Joined::leave);
        }
    }

    /** The channel said an operator revoked this lease ({@code DLOCK.REVOKE}), for reason. */
    private void revoked(String reason) {
        lose(LossReason.REVOKED, reason);
    }

    /** Stops listening on the channel, once the lease ended. */
    private void stopListening() {
        List<Channels.Joined> joined;
        synchronized (this) {
            joined = listening;
            listening = List.of();
        }
        joined.forEach(Channels.Joined::leave);
    }

    /** The RENEW (a set's RENEWALL) of this grant to ttlMs from now, with its fence (fences). */
    private List<String> renewArgs(long ttlMs) {
        return resources == null ? Protocol.renewArgs(resource, token, ttlMs, locks.fenceArg(Protocol.RENEW, fence))
                : Protocol.renewAllArgs(resources, token, ttlMs, fences);
    }

    /** The RELEASE (a set's RELEASEALL) of this grant, with its fence (fences). */
    private List<String> releaseArgs() {
        return resources == null ? Protocol.releaseArgs(resource, token, locks.fenceArg(Protocol.RELEASE, fence))
                : Protocol.releaseAllArgs(resources, token, fences);
    }

    /** A set's fences, in its members' order. */
    long[] memberFences() {
        return fences.clone();
    }

    /** The resource, or a set's members joined by ',' (as log lines give it). */
    String name() {
        return name;
    }

    /** The fence, or a set's fences joined by ',' (as log lines give it). */
    String fenceName() {
        return fenceName;
    }

    /**
     * The locked resource (the lock's key).
     *
     * @return the resource
     */
    public String resource() {
        return resource;
    }

    /**
     * The lease's owner token: random, made before the first ACQUIRE, secret to the holder.
     *
     * @return the token
     */
    public String token() {
        return token;
    }

    /**
     * The fencing token: larger for every newer grant of the resource (an unsigned 64-bit number;
     * {@link Long#toUnsignedString(long)} prints it). Send it with every write the lease protects.
     *
     * @return the fence
     */
    public long fence() {
        return fence;
    }

    /**
     * Whether this is a shared lease (a reader or a permit) rather than an exclusive one.
     *
     * @return true for a shared lease
     */
    public boolean isShared() {
        return shared;
    }

    /**
     * The lease's length as the server was sent it (whole milliseconds); it is renewed every third
     * of it.
     *
     * @return the ttl
     */
    public Duration ttl() {
        return Duration.ofMillis(ttlMs);
    }

    /**
     * Whether the lease is lost (it may have been lost without anyone noticing yet: {@link #check()}
     * also looks at the local expiry).
     *
     * @return true once lost
     */
    public boolean isLost() {
        return lost.isDone();
    }

    /**
     * Why the lease was lost.
     *
     * @return the reason, or empty while it holds
     */
    public Optional<LossReason> lostReason() {
        return isLost() ? Optional.of(lost.join().reason()) : Optional.empty();
    }

    /**
     * Throws if the lease is lost, or if its conservative local expiry passed without an answered
     * renewal (it counts as lost from then on: {@link LossReason#UNREACHABLE} when the last renewal
     * sent got no answer, {@link LossReason#STALLED} when none was waiting for one). Call it
     * between the steps of long work.
     *
     * @throws LeaseLostException if the lease no longer protects the work
     */
    public void check() {
        boolean expired;
        synchronized (this) {
            expired = !releaseRan && System.nanoTime() - localExpiry >= 0;
        }
        if (expired) {
            loseAtExpiry();
        }
        if (lost.isDone()) {
            throw lossError();
        }
    }

    /**
     * The local expiry passed without an answered renewal: lost, {@code unreachable} when the last
     * renewal sent got no answer (it failed, timed out or is still outstanding), {@code stalled}
     * when none was waiting for one (this process did not run in time to send the due renewal or
     * to read its answer: a blocked scheduler thread, a long collector pause, a stopped process).
     */
    private void loseAtExpiry() {
        boolean unanswered;
        synchronized (this) {
            unanswered = renewalUnanswered;
        }
        lose(unanswered ? LossReason.UNREACHABLE : LossReason.STALLED);
    }

    /** Whether the local expiry passed by {@code now} (nanoTime). */
    private synchronized boolean expiredAt(long now) {
        return now - localExpiry >= 0;
    }

    /** A new exception for each throw of the loss (its cause: the loss as first recorded, which whenLost gives). */
    private LeaseLostException lossError() {
        return new LeaseLostException(lost.join());
    }

    /**
     * Completes with the {@link LeaseLostException} the moment the lease is known lost; never
     * completes for a lease released in time.
     *
     * @return the loss, later
     */
    public CompletionStage<LeaseLostException> whenLost() {
        // Completed on the Locks' own threads: a loss noticed by a renewal is noticed on Lettuce's
        // I/O thread, where the caller's callbacks must not run.
        CompletableFuture<LeaseLostException> out = new CompletableFuture<>();
        lost.thenAccept(loss -> {
            try {
                locks.callbacks().execute(() -> out.complete(loss));
            } catch (java.util.concurrent.RejectedExecutionException e) {
                out.complete(loss); // the Locks closed
            }
        });
        return out;
    }

    /** The Locks closes: the lease is lost (nothing renews it any more) and released; completes with that release. */
    CompletableFuture<?> closedWithLocks() {
        lose(LossReason.UNREACHABLE);
        return lossRelease;
    }

    /**
     * A conservative end of the lease on this process's monotonic clock ({@link System#nanoTime()}):
     * counted from before the last answered ACQUIRE or RENEW was sent. A lease a ticket started on
     * its own channel's message ({@link HoldOptions#tickets(Duration)}) runs until the send time of
     * the ACQUIRE the message named plus the claim window, until its claim (the first renewal,
     * sent at the grant) is answered.
     *
     * @return the local expiry in nanoTime
     */
    public synchronized long localExpiryNanos() {
        return localExpiry;
    }

    private synchronized void schedule() {
        if (releasing || lost.isDone()) {
            return;
        }
        long due = Math.min(nextRenewal, localExpiry);
        if (holdEnd != 0) {
            due = Math.min(due, holdEnd - MAX_HOLD_ROUNDING_NANOS);
        }
        long delay = Math.max(0, due - System.nanoTime());
        try {
            timer = locks.scheduler().schedule(this::tick, delay, TimeUnit.NANOSECONDS);
        } catch (java.util.concurrent.RejectedExecutionException e) {
            // The Locks closed: the lease ends with its ttl.
        }
    }

    private void tick() {
        long now = System.nanoTime();
        synchronized (this) {
            if (releasing || lost.isDone() || renewing) {
                return;
            }
        }
        if (holdEnd != 0 && now - (holdEnd - MAX_HOLD_ROUNDING_NANOS) >= 0) {
            lose(LossReason.MAX_HOLD);
            return;
        }
        boolean due;
        synchronized (this) {
            if (now - localExpiry >= 0) {
                due = false;
            } else {
                due = now - nextRenewal >= 0;
                renewing = due;
            }
        }
        if (expiredAt(now)) {
            loseAtExpiry(); // checked before a late renewal is sent: a renewal found due now is not sent
            return;
        }
        if (!due) {
            schedule();
            return;
        }
        renewAsync().whenComplete((renewed, failure) -> {
            synchronized (this) {
                renewing = false;
            }
            schedule();
        });
    }

    /**
     * Sends one RENEW: true renewed, false refused (the lease is lost); fails when no answer came in
     * time. Past the local expiry nothing is sent: the lease is lost, and this fails with the loss.
     */
    private CompletableFuture<Boolean> renewAsync() {
        long renewMs = renewalMs();
        long sent = System.nanoTime();
        boolean expired;
        Claim pending;
        synchronized (this) {
            expired = !releaseRan && expiredAt(sent);
            if (!expired) {
                renewalUnanswered = true; // until an answer comes
            }
            pending = claim; // a started lease's claim: its answer is this renewal's
            claim = null;
        }
        if (expired) {
            loseAtExpiry();
            return CompletableFuture.failedFuture(lossError());
        }
        List<String> args = renewArgs(renewMs);
        CompletableFuture<Object> answer;
        if (pending != null) {
            answer = pending.answer();
            renewMs = pending.renewMs();
            sent = pending.sent();
        } else {
            answer = locks.transport().send(args, renewalTimeout(sent));
        }
        return answered(args, answer, sent, renewMs);
    }

    /** The ttl a RENEW sends now: the lease's, never past the max hold. */
    private long renewalMs() {
        return holdEnd == 0 ? ttlMs : Math.min(ttlMs, Protocol.wholeMs(Duration.ofNanos(holdEnd - System.nanoTime())));
    }

    /** How long a RENEW sent at {@code sent} waits for its answer: a request timeout, never past the local expiry. */
    private Duration renewalTimeout(long sent) {
        return Duration.ofNanos(Math.max(1_000_000, Math.min(options.requestTimeoutValue().toNanos(), localExpiryNanos() - sent)));
    }

    /** A RENEW's answer read: the new local expiry (renewed), a loss (refused), or a failure. */
    private CompletableFuture<Boolean> answered(List<String> args, CompletableFuture<Object> answer, long sent, long renewMs) {
        return answer.handle((reply, failure) -> {
            if (failure == null && reply instanceof Long n) {
                synchronized (this) {
                    renewalUnanswered = false;
                }
                if (n == 1) {
                    synchronized (this) {
                        localExpiry = Protocol.localExpiry(sent, renewMs);
                        nextRenewal = System.nanoTime() + Protocol.renewalPeriodNanos(ttlMs);
                    }
                    return true;
                }
                locks.metrics().renewalFailed("refused");
                Locks.log(Protocol.LogLine.RENEWAL_FAILED, "resource", name, "owner", token,
                        "fence", fenceName, "reason", "refused");
                boolean quiet;
                synchronized (this) {
                    quiet = releasing; // a RENEW in flight as the release ran may be refused: not a loss
                }
                if (!quiet) {
                    lose(LossReason.RENEWAL_REFUSED);
                }
                return false;
            }
            if (failure != null && locks.dropRefused(args, failure)) {
                return false; // FENCE refused by an older server: the next RENEW goes without it at once
            }
            locks.metrics().renewalFailed("error");
            Locks.log(Protocol.LogLine.RENEWAL_FAILED, "resource", name, "owner", token, "fence", fenceName,
                    "reason", "error", "error", failure != null ? Transport.unwrap(failure) : reply);
            synchronized (this) {
                nextRenewal = System.nanoTime() + Protocol.renewalRetryNanos(ttlMs);
            }
            if (failure != null) {
                throw new java.util.concurrent.CompletionException(failure);
            }
            return false;
        });
    }

    /**
     * Sends a RENEW now (the scheduler also does, every ttl/3). Past the local expiry nothing is
     * sent: the lease is lost ({@link #check()}).
     *
     * @return true renewed; false refused, and the lease is lost ({@link LossReason#RENEWAL_REFUSED})
     * @throws LeaseLostException if the lease was lost before, or its local expiry passed
     * @throws DlockException if no answer came in time
     */
    public boolean renew() {
        if (lost.isDone()) {
            throw lossError();
        }
        try {
            return renewAsync().get();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw Locks.failure(e);
        } catch (java.util.concurrent.ExecutionException e) {
            throw Locks.failure(e.getCause());
        }
    }

    /**
     * Marks the lease lost (once): completes whenLost, logs, counts, and releases it with FENCE at
     * once (best effort; not after a revocation or a release that found it gone: it is gone).
     */
    boolean lose(LossReason reason) {
        return lose(reason, "");
    }

    private boolean lose(LossReason reason, String detail) {
        LeaseLostException loss = resources == null ? new LeaseLostException(resource, fence, reason, detail)
                : new LeaseLostException(resources, fences, reason, detail);
        if (!lost.complete(loss)) {
            return false;
        }
        locks.untrack(this);
        synchronized (this) {
            if (timer != null) {
                timer.cancel(false);
            }
        }
        stopListening();
        locks.metrics().leaseLost(reason);
        if (detail.isEmpty()) {
            Locks.log(Protocol.LogLine.LEASE_LOST, "resource", name, "owner", token, "fence", fenceName,
                    "reason", reason.wireName());
        } else {
            Locks.log(Protocol.LogLine.LEASE_LOST, "resource", name, "owner", token, "fence", fenceName,
                    "reason", reason.wireName(), "detail", detail);
        }
        if (reason == LossReason.REVOKED) {
            boolean releaseCounts;
            synchronized (this) {
                releaseCounts = releaseRan; // a release under way counts the hold
            }
            if (!releaseCounts) {
                locks.metrics().held(Duration.ofNanos(System.nanoTime() - granted));
                if (resources != null) {
                    // A revoked member ended alone: the set's other members pass on at once.
                    lossRelease = locks.transport().send(releaseArgs(), options.releaseTimeoutValue());
                }
            }
        } else if (reason != LossReason.ENDED) {
            // A lease the server still holds passes on at once instead of at its ttl.
            lossRelease = locks.transport().send(releaseArgs(), options.releaseTimeoutValue());
            locks.metrics().held(Duration.ofNanos(System.nanoTime() - granted));
        }
        return true;
    }

    /**
     * Stops the renewals and releases the lease ({@code DLOCK.RELEASE} with FENCE) in one request
     * bounded by the release timeout. Later calls do nothing.
     *
     * @throws LeaseLostException if the lease was lost before, or found gone now ({@link LossReason#ENDED})
     * @throws NotReleasedException if the server did not answer in time (the lease ends with its ttl)
     */
    public void release() {
        end(0);
    }

    /**
     * Stops the renewals and lets the lease end {@code delay} from now instead of releasing it: one
     * {@code DLOCK.RENEW} with FENCE and that ttl (a shorter ttl shortens the lease; never past the
     * max hold), bounded by the release timeout, after which nothing more is sent. Nobody else gets
     * the resource before then: a minimum hold, such as ShedLock's {@code lockAtLeastFor}. A delay
     * under 1 ms is a {@link #release()}. Later calls, and a release after it, do nothing.
     *
     * @param delay how long from now the resource stays held
     * @throws LeaseLostException if the lease was lost before, or found gone now ({@link LossReason#ENDED})
     * @throws NotReleasedException if the server did not answer in time (the lease ends with the
     *     ttl it last had)
     */
    public void releaseAfter(Duration delay) {
        long keepMs = delay.compareTo(Duration.ofMillis(1)) < 0 ? 0 : delay.toMillis();
        if (keepMs != 0 && holdEnd != 0) {
            keepMs = Math.max(1, Math.min(keepMs, Duration.ofNanos(holdEnd - System.nanoTime()).toMillis()));
        }
        end(keepMs);
    }

    /** Ends the hold: a RELEASE (keepMs 0), or a last RENEW to keepMs from now. */
    private void end(long keepMs) {
        synchronized (this) {
            if (releaseRan) {
                return;
            }
            releaseRan = true;
            releasing = true;
            locks.untrack(this);
            if (timer != null) {
                timer.cancel(false);
            }
        }
        try {
            endOnce(keepMs);
        } finally {
            stopListening(); // after the RELEASE: a revocation until then is still heard
        }
    }

    private void endOnce(long keepMs) {
        if (!lost.isDone() && expiredAt(System.nanoTime())) {
            loseAtExpiry(); // the work ran past the local expiry: a loss, not a release
        }
        if (lost.isDone()) {
            throw lossError();
        }
        Object reply;
        try {
            reply = locks.call(() -> keepMs == 0 ? releaseArgs() : renewArgs(keepMs), options.releaseTimeoutValue());
        } catch (Exception e) {
            if (e instanceof InterruptedException) {
                Thread.currentThread().interrupt();
            }
            // The outcome is unknown for a lease believed live: a release failure.
            locks.metrics().held(Duration.ofNanos(System.nanoTime() - granted));
            locks.metrics().releaseFailed();
            Locks.log(Protocol.LogLine.RELEASE_FAILED, "resource", name, "owner", token, "fence", fenceName,
                    "error", Transport.unwrap(e));
            if (System.nanoTime() - localExpiryNanos() >= 0) {
                lose(LossReason.UNREACHABLE);
                throw lossError();
            }
            throw new NotReleasedException(name, fence, Transport.unwrap(e));
        }
        locks.metrics().held(Duration.ofNanos(System.nanoTime() - granted));
        // Every member released (a RENEW, a RELEASE: 1); fewer, and one ended before.
        long expected = keepMs != 0 || resources == null ? 1 : resources.size();
        if (Long.valueOf(expected).equals(reply)) {
            if (keepMs == 0) {
                Locks.log(Protocol.LogLine.LEASE_RELEASED, "resource", name, "owner", token, "fence", fenceName);
            }
            return;
        }
        // Gone before the work ended: the end of the work was not protected. One event, counted
        // and logged once, as the loss (not as a release failure too).
        lose(LossReason.ENDED);
        throw lossError();
    }

    /**
     * Releases the lease ({@link #release()}): the end of a try-with-resources block.
     *
     * @throws LeaseLostException if the lease was lost while the block ran
     * @throws NotReleasedException if it could not be released in time
     */
    @Override
    public void close() {
        release();
    }

    /**
     * Runs the work under this lease and releases it after, with {@link Locks#run}'s rules: the
     * work's thread is interrupted the moment the lease is lost; the work's own exception is the
     * one thrown (a loss or failed release added as suppressed); a loss is never hidden.
     *
     * @param <T> the work's result
     * @param work the protected work
     * @return the work's result
     * @throws Exception the work's own exception
     */
    public <T> T run(Locks.LeaseWork<T> work) throws Exception {
        Thread worker = Thread.currentThread();
        Object guard = new Object();
        boolean[] state = {true, false}; // working, interrupted by us
        lost.thenAccept(loss -> {
            synchronized (guard) {
                if (state[0]) {
                    state[1] = true;
                    worker.interrupt();
                }
            }
        });
        T result = null;
        Exception failure = null;
        try {
            result = work.call(this);
        } catch (Exception e) {
            failure = e;
        } finally {
            synchronized (guard) {
                state[0] = false;
                if (state[1]) {
                    Thread.interrupted(); // our own interrupt, not the caller's
                }
            }
        }
        Exception interruption = null;
        if (state[1] && failure instanceof InterruptedException) {
            // The work stopped because we interrupted it for the loss: the loss is what happened.
            interruption = failure;
            failure = null;
        }
        try {
            release();
        } catch (DlockException e) {
            if (failure == null) {
                if (interruption != null) {
                    e.addSuppressed(interruption);
                }
                throw e;
            }
            failure.addSuppressed(e);
        }
        if (interruption != null) {
            LeaseLostException loss = lossError();
            loss.addSuppressed(interruption);
            throw loss;
        }
        if (failure != null) {
            throw failure;
        }
        return result;
    }

    /**
     * Runs a command in the server only if this lease's fence still holds the resource
     * ({@code DLOCK.FENCED}); see {@link Locks#fenced}.
     *
     * @param command the command and its arguments
     * @return the command's reply
     * @throws StaleFenceException if the fence no longer holds: nothing ran
     */
    public Object fenced(String... command) {
        return locks.fenced(resource, fence, Arrays.asList(command));
    }

    /**
     * Whether this lease's fence still holds the resource on the server.
     *
     * @return true while it holds
     */
    public boolean fenceCheck() {
        return locks.fenceCheck(resource, fence);
    }

    @Override
    public String toString() {
        return "Lease[" + name + ", fence " + fenceName + (isLost() ? ", lost" : "") + "]";
    }
}
