package dev.dlock.spring.integration;

import dev.dlock.HoldOptions;
import dev.dlock.Lease;
import dev.dlock.Locks;
import dev.dlock.NotAcquiredException;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import org.springframework.integration.support.locks.DistributedLock;

/**
 * A {@link java.util.concurrent.locks.Lock} of a {@link DlockLockRegistry}: a local
 * {@link ReentrantLock} orders this process's threads, and the thread's outermost hold takes an
 * exclusive dlock lease on the resource, renewed every ttl/3 on the {@link Locks}' one scheduler
 * thread until the matching {@link #unlock()} releases it. Reentrant: nested holds by the thread
 * share its lease. {@link #fence()} is the lease's fencing token, for the writes the lock protects.
 *
 * <p>A lease lost while the lock is held (an operator's revocation, a renewal refused, the local
 * expiry passed) does not interrupt the holder ({@code Lock} has no such notion): {@link #lease()}
 * tells of it ({@link Lease#check()}, {@link Lease#whenLost()}), and {@link #unlock()} throws the
 * {@link dev.dlock.LeaseLostException}, as {@code RedisLockRegistry}'s unlock throws when its key
 * expired meanwhile.
 */
public final class DlockLock implements DistributedLock {
    private final Locks locks;
    private final String resource;
    private final HoldOptions options;
    private final ReentrantLock local = new ReentrantLock();
    private Lease lease; // the holding thread's, while it holds; guarded by local
    private volatile long lastUsed = System.currentTimeMillis();

    DlockLock(Locks locks, String resource, HoldOptions options) {
        this.locks = locks;
        this.resource = resource;
        this.options = options;
    }

    /**
     * The dlock resource this lock holds: the registry key, a colon, the lock key.
     *
     * @return the resource
     */
    public String resource() {
        return resource;
    }

    /**
     * Waits until the lock is held (for ever, uninterruptibly: an interrupt meanwhile is kept for
     * the caller), with the registry's hold options.
     *
     * @throws dev.dlock.NotAcquiredException if the server could not be reached or the outcome
     *     stayed unknown (nothing is held then)
     */
    @Override
    public void lock() {
        lockUninterruptibly(options);
    }

    /**
     * {@link #lock()} with the lease's ttl {@code ttl} instead of the registry's (how long the lock
     * outlives a process that died; it is renewed while this one lives).
     *
     * @param ttl the lease's ttl
     */
    @Override
    public void lock(Duration ttl) {
        lockUninterruptibly(options.ttl(ttl));
    }

    private void lockUninterruptibly(HoldOptions hold) {
        boolean interrupted = false;
        try {
            while (true) {
                try {
                    if (acquire(hold.waitForever(), true)) {
                        return;
                    }
                } catch (InterruptedException e) {
                    interrupted = true; // Lock.lock() waits on: the interrupt is the caller's, kept for after
                }
            }
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /**
     * Waits until the lock is held, or the thread is interrupted.
     *
     * @throws InterruptedException if interrupted first (nothing is held, nothing left in line)
     */
    @Override
    public void lockInterruptibly() throws InterruptedException {
        while (!acquire(options.waitForever(), true)) {
            // not granted in a round of the wait: wait again
        }
    }

    /**
     * Takes the lock if it is free now: one {@code DLOCK.ACQUIRE} that does not wait.
     *
     * @return true if it is held now
     */
    @Override
    public boolean tryLock() {
        try {
            return acquire(options.noWait(), false);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return false;
        }
    }

    /**
     * Takes the lock, waiting up to {@code time} (in this process, then in the server's queue).
     *
     * @param time the longest wait
     * @param unit its unit
     * @return true if it is held now
     * @throws InterruptedException if interrupted while waiting (nothing is held then)
     */
    @Override
    public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
        return acquireBy(options, System.nanoTime() + Math.max(0, unit.toNanos(time)));
    }

    /**
     * {@link #tryLock(long, TimeUnit)} with the lease's ttl {@code ttl} instead of the registry's.
     *
     * @param waitTime the longest wait
     * @param ttl the lease's ttl
     * @return true if it is held now
     * @throws InterruptedException if interrupted while waiting (nothing is held then)
     */
    @Override
    public boolean tryLock(Duration waitTime, Duration ttl) throws InterruptedException {
        return acquireBy(options.ttl(ttl), System.nanoTime() + Math.max(0, waitTime.toNanos()));
    }

    /** Takes the local lock, then the lease, both by the deadline (nanoTime). */
    private boolean acquireBy(HoldOptions hold, long deadline) throws InterruptedException {
        if (!local.tryLock(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS)) {
            return false;
        }
        long left = Math.max(0, deadline - System.nanoTime());
        return takeLease(left == 0 ? hold.noWait() : hold.waitFor(Duration.ofNanos(left)));
    }

    /** Takes the local lock (waiting for ever, interruptibly, or not at all), then the lease. */
    private boolean acquire(HoldOptions hold, boolean wait) throws InterruptedException {
        if (wait) {
            local.lockInterruptibly();
        } else if (!local.tryLock()) {
            return false;
        }
        return takeLease(hold);
    }

    /**
     * With the local lock held once more: the thread's outermost hold takes the lease. On false or
     * an exception the local hold is undone.
     */
    private boolean takeLease(HoldOptions hold) throws InterruptedException {
        touch();
        if (local.getHoldCount() > 1) {
            return true; // reentered: the thread's lease serves
        }
        boolean granted = false;
        try {
            lease = locks.hold(resource, hold);
            granted = true;
            return true;
        } catch (NotAcquiredException e) {
            if (e.getCause() instanceof InterruptedException) {
                Thread.interrupted(); // thrown as InterruptedException, which clears the status
                InterruptedException interrupted = new InterruptedException("interrupted while acquiring " + resource);
                interrupted.initCause(e);
                throw interrupted;
            }
            if (e.outcome() == NotAcquiredException.Outcome.HELD) {
                return false;
            }
            throw e;
        } finally {
            if (!granted) {
                local.unlock();
            }
        }
    }

    /**
     * Undoes one hold of the calling thread; the outermost releases the lease
     * ({@code DLOCK.RELEASE} with its fence).
     *
     * @throws IllegalMonitorStateException if the calling thread does not hold the lock
     * @throws dev.dlock.LeaseLostException if the lease was lost while it was held (the lock is
     *     unlocked all the same)
     * @throws dev.dlock.NotReleasedException if the release got no answer in time (the lease ends
     *     with its ttl; the lock is unlocked here)
     */
    @Override
    public void unlock() {
        if (!local.isHeldByCurrentThread()) {
            throw new IllegalMonitorStateException(resource + " is not held by this thread");
        }
        touch();
        if (local.getHoldCount() > 1) {
            local.unlock();
            return;
        }
        Lease held = lease;
        lease = null;
        try {
            held.release();
        } finally {
            local.unlock();
        }
    }

    /**
     * Not offered: a condition would wait without the lease's protection.
     *
     * @return never
     * @throws UnsupportedOperationException always
     */
    @Override
    public Condition newCondition() {
        throw new UnsupportedOperationException("dlock locks offer no Condition");
    }

    /**
     * The lease of the calling thread's hold.
     *
     * @return the lease
     * @throws IllegalMonitorStateException if the calling thread does not hold the lock
     */
    public Lease lease() {
        if (!local.isHeldByCurrentThread()) {
            throw new IllegalMonitorStateException(resource + " is not held by this thread");
        }
        return lease;
    }

    /**
     * The fencing token of the calling thread's hold: send it with every write the lock protects.
     *
     * @return the fence
     * @throws IllegalMonitorStateException if the calling thread does not hold the lock
     */
    public long fence() {
        return lease().fence();
    }

    /**
     * Whether the calling thread holds the lock.
     *
     * @return true while it does
     */
    public boolean isHeldByCurrentThread() {
        return local.isHeldByCurrentThread();
    }

    /** Held by some thread of this process (what {@link DlockLockRegistry#expireUnusedOlderThan} keeps). */
    boolean isLocked() {
        return local.isLocked();
    }

    void touch() {
        lastUsed = System.currentTimeMillis();
    }

    long lastUsed() {
        return lastUsed;
    }

    @Override
    public String toString() {
        return "DlockLock[" + resource + (local.isLocked() ? ", locked" : "") + "]";
    }
}
