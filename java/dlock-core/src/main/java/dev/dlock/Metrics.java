package dev.dlock;

import java.time.Duration;

/**
 * Where the client's figures go; every method does nothing by default. The names an adapter
 * should give them are the contract's ({@code docs/protocol.md}, section 13):
 * {@code dlock_client_acquire_attempts_total}, {@code dlock_client_acquire_failures_total{reason}},
 * {@code dlock_client_acquire_seconds}, {@code dlock_client_hold_seconds},
 * {@code dlock_client_renewal_failures_total{reason}}, {@code dlock_client_release_failures_total},
 * {@code dlock_client_leases_lost_total{reason}}, {@code dlock_client_stale_writes_total}.
 */
public interface Metrics {
    /** Counts nothing. */
    Metrics NONE = new Metrics() {};

    /** An acquire attempt started ({@code dlock_client_acquire_attempts_total}). */
    default void acquireAttempt() {}

    /**
     * An attempt granted nothing ({@code dlock_client_acquire_failures_total{reason}}).
     *
     * @param reason {@code held}, {@code unreachable}, {@code unknown} or {@code server}
     */
    default void acquireFailed(String reason) {}

    /**
     * An attempt was granted ({@code dlock_client_acquire_seconds}).
     *
     * @param took from the attempt's start to the grant
     */
    default void acquired(Duration took) {}

    /**
     * A lease ended ({@code dlock_client_hold_seconds}).
     *
     * @param held from the grant to its end
     */
    default void held(Duration held) {}

    /**
     * A renewal failed ({@code dlock_client_renewal_failures_total{reason}}).
     *
     * @param reason {@code refused} or {@code error}
     */
    default void renewalFailed(String reason) {}

    /**
     * A release failed ({@code dlock_client_release_failures_total}): a RELEASE (or
     * {@link Lease#releaseAfter}'s last RENEW) whose outcome is unknown (no answer, a connection or
     * server error) for a lease still believed live. A release that found the lease gone is the
     * loss {@link LossReason#ENDED} ({@link #leaseLost}), not also a release failure; the
     * best-effort RELEASE after a loss is never counted.
     */
    default void releaseFailed() {}

    /**
     * A lease was lost ({@code dlock_client_leases_lost_total{reason}}), once per lease.
     *
     * @param reason the loss reason (label it with {@link LossReason#wireName()})
     */
    default void leaseLost(LossReason reason) {}

    /** A fenced write was refused as stale ({@code dlock_client_stale_writes_total}). */
    default void staleWrite() {}
}
