package dev.dlock;

import java.time.Duration;
import java.util.Objects;

/**
 * The options of one hold, immutable: each method returns a copy with one setting changed.
 *
 * <pre>{@code
 * HoldOptions options = HoldOptions.defaults().ttl(Duration.ofSeconds(30)).waitFor(Duration.ofSeconds(5));
 * }</pre>
 *
 * Defaults: ttl 30 s, wait 10 s, request timeout 2 s, release timeout = request timeout,
 * blocking waits (tickets of 6 s when chosen), no max hold, no metadata.
 */
public final class HoldOptions {
    private static final HoldOptions DEFAULTS = new HoldOptions(Duration.ofSeconds(30), Duration.ofSeconds(10),
            Duration.ofSeconds(2), null, false, Duration.ofSeconds(6), null, null);

    private final Duration ttl;
    private final Duration wait; // null: no limit
    private final Duration requestTimeout;
    private final Duration releaseTimeout; // null: requestTimeout
    private final boolean tickets;
    private final Duration ticket;
    private final Duration maxHold; // null: none
    private final String meta;

    private HoldOptions(Duration ttl, Duration wait, Duration requestTimeout, Duration releaseTimeout,
            boolean tickets, Duration ticket, Duration maxHold, String meta) {
        this.ttl = ttl;
        this.wait = wait;
        this.requestTimeout = requestTimeout;
        this.releaseTimeout = releaseTimeout;
        this.tickets = tickets;
        this.ticket = ticket;
        this.maxHold = maxHold;
        this.meta = meta;
    }

    /**
     * The defaults.
     *
     * @return the default options
     */
    public static HoldOptions defaults() {
        return DEFAULTS;
    }

    /**
     * The lease's length (default 30 s); it is renewed every third of it while held.
     *
     * @param ttl at least 1 ms
     * @return a copy with this ttl
     */
    public HoldOptions ttl(Duration ttl) {
        return new HoldOptions(positive(ttl, "ttl"), wait, requestTimeout, releaseTimeout, tickets, ticket, maxHold, meta);
    }

    /**
     * How long to wait in the server's queue for a held resource (default 10 s; zero: one try).
     *
     * @param wait the longest wait
     * @return a copy with this wait
     */
    public HoldOptions waitFor(Duration wait) {
        Objects.requireNonNull(wait, "wait");
        if (wait.isNegative()) {
            throw new IllegalArgumentException("wait must not be negative: " + wait);
        }
        return new HoldOptions(ttl, wait, requestTimeout, releaseTimeout, tickets, ticket, maxHold, meta);
    }

    /**
     * No wait: one try, {@link NotAcquiredException} with {@code HELD} if someone holds it.
     *
     * @return a copy without a wait
     */
    public HoldOptions noWait() {
        return waitFor(Duration.ZERO);
    }

    /**
     * Wait in the server's queue until granted.
     *
     * @return a copy waiting without limit
     */
    public HoldOptions waitForever() {
        return new HoldOptions(ttl, null, requestTimeout, releaseTimeout, tickets, ticket, maxHold, meta);
    }

    /**
     * Bounds one request to the server (default 2 s); a wait adds its own length. It also sets the
     * claim window: twice it, at least 1 s, at most the ttl.
     *
     * @param timeout the request timeout
     * @return a copy with this timeout
     */
    public HoldOptions requestTimeout(Duration timeout) {
        return new HoldOptions(ttl, wait, positive(timeout, "request timeout"), releaseTimeout, tickets, ticket, maxHold, meta);
    }

    /**
     * Bounds the RELEASE at the end of a hold (default: the request timeout).
     *
     * @param timeout the release timeout
     * @return a copy with this timeout
     */
    public HoldOptions releaseTimeout(Duration timeout) {
        return new HoldOptions(ttl, wait, requestTimeout, positive(timeout, "release timeout"), tickets, ticket, maxHold, meta);
    }

    /**
     * Wait with {@code QUEUE} tickets, each told of its turn on its own channel (one pub/sub
     * connection per server, shared by every waiter) instead of a blocking wait on a connection
     * per waiter: the lease starts on that message and is claimed by its first renewal, sent at
     * once. A server without {@code NOTIFY} wakes its ticket waiters through the resource's
     * channel.
     *
     * @param ticket the ticket's life (refreshed every third of it)
     * @return a copy waiting with tickets
     */
    public HoldOptions tickets(Duration ticket) {
        return new HoldOptions(ttl, wait, requestTimeout, releaseTimeout, true, positive(ticket, "ticket"), maxHold, meta);
    }

    /**
     * Wait with {@code DLOCK.ACQUIRE ... WAIT} on a connection of its own (the default).
     *
     * @return a copy waiting by blocking
     */
    public HoldOptions blocking() {
        return new HoldOptions(ttl, wait, requestTimeout, releaseTimeout, false, ticket, maxHold, meta);
    }

    /**
     * Bounds the whole hold: renewals never go past it, and the lease is lost
     * ({@link LossReason#MAX_HOLD}) when it passes.
     *
     * @param maxHold the longest hold
     * @return a copy with this bound
     */
    public HoldOptions maxHold(Duration maxHold) {
        return new HoldOptions(ttl, wait, requestTimeout, releaseTimeout, tickets, ticket, positive(maxHold, "max hold"), meta);
    }

    /**
     * Describes the holder ({@code META}): {@code DLOCK.INFO} shows it; an election's candidate
     * gives its address here.
     *
     * @param meta the description
     * @return a copy with this metadata
     */
    public HoldOptions meta(String meta) {
        return new HoldOptions(ttl, wait, requestTimeout, releaseTimeout, tickets, ticket, maxHold, Objects.requireNonNull(meta, "meta"));
    }

    private static Duration positive(Duration d, String what) {
        Objects.requireNonNull(d, what);
        if (d.toMillis() < 1) {
            throw new IllegalArgumentException(what + " must be at least 1 ms, not " + d);
        }
        return d;
    }

    Duration ttl() {
        return ttl;
    }

    /** Null: no limit. */
    Duration waitLimit() {
        return wait;
    }

    Duration requestTimeoutValue() {
        return requestTimeout;
    }

    Duration releaseTimeoutValue() {
        return releaseTimeout != null ? releaseTimeout : requestTimeout;
    }

    boolean usesTickets() {
        return tickets;
    }

    Duration ticket() {
        return ticket;
    }

    Duration maxHoldValue() {
        return maxHold;
    }

    String metaValue() {
        return meta;
    }
}
