package dev.dlock.shedlock;

import dev.dlock.Lease;
import dev.dlock.LeaseLostException;
import java.time.Duration;
import java.util.Optional;
import net.javacrumbs.shedlock.core.AbstractSimpleLock;
import net.javacrumbs.shedlock.core.ClockProvider;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;

/**
 * A ShedLock lock held as a dlock lease: {@link #fence()} is its fencing token. Unlock or extend
 * it once (ShedLock's rule: a second call throws {@link IllegalStateException}).
 */
public final class DlockSimpleLock extends AbstractSimpleLock {
    private final Lease lease;
    private volatile boolean ended;

    DlockSimpleLock(LockConfiguration configuration, Lease lease) {
        super(configuration);
        this.lease = lease;
    }

    /**
     * The fencing token: larger for every newer grant of the lock (an unsigned 64-bit number).
     * Send it with every write the lock protects.
     *
     * @return the fence
     */
    public long fence() {
        return lease.fence();
    }

    /**
     * The lease that holds the lock: {@link Lease#check()} between a task's steps,
     * {@link Lease#whenLost()}, {@link Lease#fenced(String...)}.
     *
     * @return the lease
     */
    public Lease lease() {
        return lease;
    }

    /**
     * The configuration the lock was taken (or last extended) with.
     *
     * @return the configuration
     */
    public LockConfiguration configuration() {
        return lockConfiguration;
    }

    boolean ended() {
        return ended;
    }

    /**
     * Releases the lease, or, before {@code lockAtLeastFor} has passed, lets it expire then.
     *
     * @throws LeaseLostException if the lease was lost while the lock was held
     * @throws dev.dlock.NotReleasedException if the server did not answer in time (the lease ends with its ttl)
     */
    @Override
    protected void doUnlock() {
        ended = true;
        DlockLockProvider.ended(this);
        lease.releaseAfter(Duration.between(ClockProvider.now(), lockConfiguration.getLockAtLeastUntil()));
    }

    /**
     * Renews the lease now and returns the lock with the new {@code lockAtLeastFor} (counted from
     * now); the lease keeps the ttl it was taken with (it is renewed while held anyway).
     *
     * @return the extended lock, or empty if the lease is lost
     */
    @Override
    protected Optional<SimpleLock> doExtend(LockConfiguration next) {
        boolean renewed;
        try {
            renewed = lease.renew();
        } catch (LeaseLostException e) {
            renewed = false;
        }
        if (!renewed) {
            return Optional.empty();
        }
        ended = true;
        DlockLockProvider.ended(this);
        return Optional.of(DlockLockProvider.taken(new DlockSimpleLock(next, lease)));
    }

    @Override
    public String toString() {
        return "DlockSimpleLock[" + lockConfiguration.getName() + ", fence " + Long.toUnsignedString(lease.fence()) + "]";
    }
}
