package dev.dlock;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

/**
 * One acquire: its token (made before the first send, reused for every ambiguous retry), its
 * deadline, and what it learned so far ({@code docs/protocol.md}, sections 1 and 2). A set's
 * ({@code DLOCK.ACQUIREALL}) waits with tickets in every member's line.
 */
final class Attempt {
    /** One server-side wait lasts at most this when the caller waits without limit. */
    private static final long UNLIMITED_WAIT_SLICE_MS = 3_600_000;
    /** A WAIT answered nil earlier than this before the deadline was cut short, not timed out. */
    private static final long CUT_SHORT_MS = 50;
    private static final long WAIT_AGAIN_PAUSE_MS = 10;
    private static final long RETRY_PAUSE_MS = 50;
    private static final long MAX_RETRY_PAUSE_MS = 400;
    private static final long FORGET_AGAIN_AFTER_MS = 100;

    private final Locks locks;
    final String resource; // a set's first member (a Cluster routes the set by it)
    final List<String> resources; // a set's members, in the caller's order; null for a single resource
    final String name; // the resource, or a set's members joined by ','
    private final boolean shared;
    private final int permits;
    private final HoldOptions options;
    final String token;
    final long started = System.nanoTime();

    private final long waitUntil; // nanoTime; Long.MAX_VALUE: no limit
    final long holdEnd; // nanoTime; 0: no max hold
    final long ttlMs; // the lease's length as sent: whole milliseconds
    private long maxWaitMs; // the server's longest WAIT, once it refused a longer one
    private boolean reached; // a request may have reached the server (an answered one surely did)
    private boolean answered; // the last request was answered (cleared by every failure)
    private int failures; // ambiguous failures in a row
    private long failingSince;
    private Throwable lastFailure;

    Attempt(Locks locks, String resource, boolean shared, int permits, HoldOptions options) {
        this(locks, resource, null, shared, permits, options);
    }

    /** A set's attempt: an exclusive lease on every resource, or on none. */
    Attempt(Locks locks, List<String> resources, HoldOptions options) {
        this(locks, resources.get(0), List.copyOf(resources), false, 0, options);
    }

    private Attempt(Locks locks, String resource, List<String> resources, boolean shared, int permits, HoldOptions options) {
        this.locks = locks;
        this.resource = resource;
        this.resources = resources;
        this.name = resources == null ? resource : String.join(",", resources);
        this.shared = shared;
        this.permits = permits;
        this.options = options;
        this.token = Locks.newToken();
        Duration ttl = options.ttl();
        if (options.maxHoldValue() != null) {
            holdEnd = started + options.maxHoldValue().toNanos();
            ttl = ttl.compareTo(options.maxHoldValue()) < 0 ? ttl : options.maxHoldValue();
        } else {
            holdEnd = 0;
        }
        this.ttlMs = Protocol.wholeMs(ttl);
        Duration wait = options.waitLimit();
        this.waitUntil = wait == null ? Long.MAX_VALUE : started + wait.toNanos();
    }

    private long leftMs() {
        if (waitUntil == Long.MAX_VALUE) {
            return Long.MAX_VALUE;
        }
        return (waitUntil - System.nanoTime()) / 1_000_000;
    }

    private Protocol.AcquireForm form(Long waitMs, long queueMs) {
        return form(waitMs, queueMs, null);
    }

    /** The ACQUIRE with the options the server takes; notify: a ticket's number ({@code NOTIFY}), or null. */
    private Protocol.AcquireForm form(Long waitMs, long queueMs, Long notify) {
        long claim = locks.isRefused(Protocol.ACQUIRE, "CLAIM") ? 0
                : Protocol.claimWindowMs(options.requestTimeoutValue(), queueMs);
        String meta = locks.isRefused(Protocol.ACQUIRE, "META") ? null : options.metaValue();
        return new Protocol.AcquireForm(resource, token, ttlMs, shared, permits, waitMs, queueMs, claim, meta, notify);
    }

    Lease run() {
        if (resources != null) {
            return tickets();
        }
        if (options.usesTickets() && !locks.isRefused(Protocol.ACQUIRE, "QUEUE") && leftMs() > 0) {
            Lease lease = tickets();
            if (lease != null) {
                return lease;
            }
        }
        return blocking();
    }

    /**
     * A plain ACQUIRE first; while time is left, ACQUIRE ... WAIT ... CLAIM on a connection of its
     * own; after a grant from the queue, the same ACQUIRE without WAIT claims it.
     */
    private Lease blocking() {
        boolean waitNext = false;
        while (true) {
            checkInterrupted();
            long sent = System.nanoTime();
            boolean waited = false;
            Object reply;
            try {
                if (waitNext && leftMs() > 0) {
                    long waitMs = Math.min(leftMs(), UNLIMITED_WAIT_SLICE_MS);
                    if (maxWaitMs > 0) {
                        waitMs = Math.min(waitMs, maxWaitMs);
                    }
                    waitMs = Math.max(1, waitMs);
                    waited = true;
                    List<String> args = form(waitMs, 0).args();
                    try {
                        reply = locks.transport().alone(resource, args,
                                Duration.ofMillis(waitMs).plus(options.requestTimeoutValue()));
                    } catch (Exception e) {
                        if (locks.dropRefused(args, e)) {
                            continue;
                        }
                        throw e;
                    }
                } else {
                    reply = locks.call(() -> form(null, 0).args(), options.requestTimeoutValue());
                }
            } catch (Exception e) {
                if (retryAfter(e)) {
                    waitNext = leftMs() > 0;
                    pause(retryPauseMs());
                    continue;
                }
                throw new IllegalStateException("unreachable");
            }
            answer();
            long fence = fenceOf(reply);
            if (fence != 0 && !waited) {
                return new Lease(locks, resource, token, fence, shared, ttlMs, options, sent, holdEnd);
            }
            if (fence != 0) {
                // Granted from the queue: claim it now (the same ACQUIRE without WAIT starts the full ttl).
                waitNext = false;
                continue;
            }
            if (waited && leftMs() > CUT_SHORT_MS) {
                // Cut short (the key moved or was deleted, a newer wait of the token took its place): again.
                pause(WAIT_AGAIN_PAUSE_MS);
                waitNext = true;
                continue;
            }
            if (leftMs() <= 0) {
                if (waited) {
                    forget(); // it may have been handed over as the wait ended
                }
                throw failed(NotAcquiredException.Outcome.HELD, false, null);
            }
            waitNext = true;
        }
    }

    /**
     * The ACQUIRE (a set's ACQUIREALL) of this attempt, with a ticket of queueMs (0: none),
     * numbered notify (null: none; a set's never is).
     */
    private List<String> acquireArgs(long queueMs, Long notify) {
        if (resources == null) {
            return form(null, queueMs, notify).args();
        }
        String meta = locks.isRefused(Protocol.ACQUIREALL, "META") ? null : options.metaValue();
        return Protocol.acquireAllArgs(resources, token, ttlMs, queueMs, meta);
    }

    /**
     * Tickets: listen before the first ACQUIRE ... QUEUE, then send the same ACQUIRE when the
     * channel says so, on every (re)subscription, and every ticket / 3. A single resource's ticket
     * listens on its own channel while the server takes {@code NOTIFY}: every ACQUIRE is numbered
     * (1, 2, 3 ...) and its send time kept, and the server tells the ticket alone of its grant
     * ({@code granted <fence> <request> <window-ms>}); the lease starts on that message, its
     * claim sent beside the work ({@link Lease#started}), unless too little of the window is left
     * or the request is not this attempt's (the next ACQUIRE then claims the turn). A server that
     * refuses {@code NOTIFY} is waited on through the resource's channel (subscribed before the
     * next ACQUIRE), woken by a hand-over to this token; a set listens on every member's channel
     * (one signal for all), woken by any message. Null: the server refused QUEUE, or the channel
     * could not be joined (fall back to blocking waits). A set always waits this way; without a
     * wait it sends one ACQUIREALL; a member's channel that cannot be joined leaves the set to its
     * refreshes.
     */
    private Lease tickets() {
        long ticketMs = resources == null ? Protocol.wholeMs(options.ticket()) : Protocol.setTicketMs(options.waitLimit());
        List<Channels.Joined> watches = new ArrayList<>();
        Channels.Signal woken = new Channels.Signal();
        boolean notify = resources == null && !locks.isRefused(Protocol.ACQUIRE, "NOTIFY");
        Channels.Watch own = null; // the ticket's own channel's watch, while it listens there
        if (leftMs() > 0) {
            for (String member : resources == null ? List.of(resource) : resources) {
                try {
                    Channels channels = locks.transport().channels(member);
                    Channels.Watch watch;
                    if (notify) {
                        watch = own = channels.joinOwn(member, token, options.requestTimeoutValue(), woken);
                    } else {
                        watch = channels.join(member, resources == null ? Protocol.tokenTag(token) : null,
                                options.requestTimeoutValue(), woken);
                    }
                    watches.add(new Channels.Joined(channels, watch));
                } catch (RuntimeException e) {
                    if (resources == null) {
                        // No channel (the slot map or the subscription connection failed): blocking
                        // waits, whose failures end the attempt with its outcome.
                        return null;
                    }
                }
            }
        }
        List<Long> sends = new ArrayList<>(); // each ACQUIRE's send time (nanoTime), numbered from 1 by NOTIFY
        boolean queued = false;
        try {
            while (true) {
                checkInterrupted();
                long sent = System.nanoTime();
                long left = leftMs();
                Object reply;
                try {
                    if (left <= 0) {
                        reply = locks.call(() -> acquireArgs(0, null), options.requestTimeoutValue());
                    } else {
                        long queue = Math.max(1, Math.min(ticketMs, left + ticketMs));
                        Long request = null;
                        if (own != null) {
                            sends.add(sent); // taken before it is sent: never late
                            request = (long) sends.size();
                        }
                        List<String> args = acquireArgs(queue, request);
                        queued = true;
                        try {
                            reply = locks.transport().call(args, options.requestTimeoutValue());
                        } catch (Exception e) {
                            String option = Protocol.unsupportedOption(Transport.errorReply(e)).orElse("");
                            if (own != null && option.equals("NOTIFY")) {
                                // An older server: not sent NOTIFY again; the resource's channel,
                                // subscribed before the next ACQUIRE.
                                locks.dropRefused(args, e);
                                if (fallBack(watches, woken) == null) {
                                    return null;
                                }
                                own = null;
                                continue;
                            }
                            if (locks.dropRefused(args, e)) {
                                if (option.equals("QUEUE") && resources == null) {
                                    return null;
                                }
                                continue;
                            }
                            throw e;
                        }
                    }
                } catch (Exception e) {
                    if (retryAfter(e)) {
                        pause(retryPauseMs());
                        continue;
                    }
                    throw new IllegalStateException("unreachable");
                }
                answer();
                if (resources != null) {
                    long[] fences = Protocol.fencesOf(reply, resources.size());
                    if (fences != null) {
                        return new Lease(locks, resources, token, fences, ttlMs, options, sent, holdEnd);
                    }
                } else {
                    long fence = fenceOf(reply);
                    if (fence != 0) {
                        return new Lease(locks, resource, token, fence, shared, ttlMs, options, sent, holdEnd);
                    }
                }
                if (left <= 0) {
                    if (queued) {
                        forget(); // takes the tickets out of line
                    }
                    throw failed(NotAcquiredException.Outcome.HELD, false, null);
                }
                try {
                    woken.await(Duration.ofMillis(Math.max(1, Math.min(Protocol.ticketRefreshMs(ticketMs), Math.max(left, 1)))));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    checkInterrupted();
                }
                Protocol.Granted granted = own == null ? null : own.granted;
                if (granted != null) {
                    own.granted = null; // read once: unless it starts the lease, the next ACQUIRE claims the turn
                    java.util.OptionalLong expiry = Protocol.startedExpiry(granted, sends, System.nanoTime(),
                            options.requestTimeoutValue());
                    if (expiry.isPresent()) {
                        return Lease.started(locks, resource, token, granted.fence(), shared, ttlMs, options,
                                expiry.getAsLong(), holdEnd);
                    }
                }
            }
        } finally {
            watches.forEach(Channels.Joined::leave);
        }
    }

    /**
     * A single resource's ticket leaves its own channel for the resource's (a server without
     * {@code NOTIFY}), joined before the next ACQUIRE. Null: that channel could not be joined.
     */
    private Channels.Joined fallBack(List<Channels.Joined> watches, Channels.Signal woken) {
        watches.forEach(Channels.Joined::leave);
        watches.clear();
        try {
            Channels channels = locks.transport().channels(resource);
            Channels.Joined joined = new Channels.Joined(channels,
                    channels.join(resource, Protocol.tokenTag(token), options.requestTimeoutValue(), woken));
            watches.add(joined);
            return joined;
        } catch (RuntimeException e) {
            return null;
        }
    }

    private void checkInterrupted() {
        if (Thread.currentThread().isInterrupted()) {
            throw giveUp(new InterruptedException("interrupted while acquiring " + name));
        }
    }

    private void pause(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            checkInterrupted();
        }
    }

    /**
     * After a failed request: true to retry (same token); otherwise throws what the attempt ends
     * with. A server error that is not retried ends it; a transport failure is retried until the
     * wait's end plus one request timeout (without a wait limit: until failures in a row last 5
     * request timeouts, at least 1 s).
     */
    private boolean retryAfter(Exception e) {
        lastFailure = e;
        answered = false; // the last request was not answered: it may still have arrived
        String reply = Transport.errorReply(e);
        if (reply != null) {
            ErrorClass errorClass = Protocol.errorClass(reply);
            long longest = Protocol.longestWaitMs(reply);
            if (longest > 0 && maxWaitMs == 0) {
                maxWaitMs = longest; // a wait longer than the server allows: wait in slices of its longest
                return true;
            }
            switch (errorClass) {
                case REDIRECT:
                    locks.transport().refreshSlots();
                    break;
                case RETRY:
                case FAILOVER:
                    break;
                case UNBLOCKED:
                    reached = true;
                    break;
                default:
                    if (reached) {
                        forget();
                    }
                    locks.metrics().acquireFailed("server");
                    throw new ServerErrorException(reply);
            }
        } else if (e instanceof InterruptedException) {
            throw giveUp(e);
        } else if (!Transport.notSent(e)) {
            reached = true;
        }
        failures++;
        long now = System.nanoTime();
        if (failures == 1) {
            failingSince = now;
        }
        long requestNanos = options.requestTimeoutValue().toNanos();
        boolean over = waitUntil != Long.MAX_VALUE
                ? now - waitUntil >= requestNanos
                : now - failingSince >= Math.max(5 * requestNanos, 1_000_000_000L);
        if (over) {
            throw unsettled();
        }
        return true;
    }

    private void answer() {
        answered = true;
        reached = true; // a fence may have been answered to it (a WAIT's or a ticket's), or be on its way
        failures = 0;
    }

    private long retryPauseMs() {
        long pause = RETRY_PAUSE_MS << Math.min(Math.max(failures - 1, 0), 8);
        return Math.max(RETRY_PAUSE_MS, Math.min(Math.min(pause, MAX_RETRY_PAUSE_MS), Math.max(leftMs(), 0)));
    }

    /** The retries ran out: unreachable if nothing could have arrived, else unknown (after releasing the token). */
    private NotAcquiredException unsettled() {
        if (!reached) {
            return failed(NotAcquiredException.Outcome.UNREACHABLE, false, lastFailure);
        }
        return failed(NotAcquiredException.Outcome.UNKNOWN, forget(), lastFailure);
    }

    /**
     * The caller interrupted the attempt: whatever may have been granted to the token (a fence
     * answered to a wait and not yet claimed, a ticket still in line, a request still on its way)
     * is released. Held if the last request was answered, unknown if it may still arrive.
     */
    private NotAcquiredException giveUp(Throwable cause) {
        if (!reached) {
            return failed(NotAcquiredException.Outcome.UNREACHABLE, false, cause);
        }
        boolean released = forget();
        return failed(answered ? NotAcquiredException.Outcome.HELD : NotAcquiredException.Outcome.UNKNOWN,
                released, cause);
    }

    private NotAcquiredException failed(NotAcquiredException.Outcome outcome, boolean released, Throwable cause) {
        locks.metrics().acquireFailed(outcome.wireName());
        return new NotAcquiredException(name, outcome, token, released, cause);
    }

    /**
     * Releases the attempt's token (no FENCE: the fence is unknown; the token is this attempt's
     * alone) from a connection opened for it, once more 100 ms later if the first found nothing.
     * True if a grant (or ticket) was found and freed.
     */
    boolean forget() {
        boolean interrupted = Thread.interrupted();
        try {
            for (int attempt = 0; attempt < 2; attempt++) {
                if (attempt > 0) {
                    try {
                        Thread.sleep(FORGET_AGAIN_AFTER_MS);
                    } catch (InterruptedException e) {
                        interrupted = true;
                    }
                }
                try {
                    Object reply = locks.transport().alone(resource, resources == null ? Protocol.releaseArgs(resource, token, 0)
                            : Protocol.releaseAllArgs(resources, token, null), options.releaseTimeoutValue());
                    if (reply instanceof Long n && n >= 1) {
                        return true;
                    }
                } catch (Exception e) {
                    Locks.LOG.log(System.Logger.Level.DEBUG, "dlock: could not release an unknown grant resource={0} error={1}",
                            name, e.toString());
                    return false;
                }
            }
            return false;
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    private static long fenceOf(Object reply) {
        if (reply == null) {
            return 0;
        }
        if (reply instanceof Long n && n != 0) {
            return n;
        }
        return Protocol.unsigned(reply);
    }
}
