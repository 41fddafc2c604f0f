package dev.dlock.shedlock;

import dev.dlock.HoldOptions;
import dev.dlock.Lease;
import dev.dlock.Locks;
import dev.dlock.NotAcquiredException;
import java.util.ArrayDeque;
import java.util.Objects;
import java.util.Optional;
import net.javacrumbs.shedlock.core.ExtensibleLockProvider;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;

/**
 * ShedLock's {@link net.javacrumbs.shedlock.core.LockProvider} on dlock leases: a lock named
 * {@code name} is an exclusive lease on the resource {@code prefix + name}, taken without waiting.
 *
 * <ul>
 *   <li>{@code lockAtMostFor} is the lease's ttl. The lease is renewed (every ttl/3) while the
 *       process lives and the lock is held, so a task that outruns it still runs alone; a process
 *       that dies keeps the lock at most that long, as ShedLock's own providers do.</li>
 *   <li>{@code lockAtLeastFor}: {@link SimpleLock#unlock()} before it has passed (counted from the
 *       configuration's creation on ShedLock's clock) leaves the lease to expire at that moment
 *       instead of releasing it ({@link Lease#releaseAfter}).</li>
 *   <li>A held lock is {@link Optional#empty()}; a server that cannot be reached, or an attempt
 *       whose outcome is unknown, throws the core's {@link NotAcquiredException} (the task does
 *       not run, and the scheduler reports the exception).</li>
 *   <li>A lease lost while the task ran (revoked by an operator, refused a renewal, unreachable
 *       past its ttl) is reported as the core reports it: the {@code dlock: lease lost} log line
 *       and metric at once, then {@code unlock()}, which ShedLock calls after the task, throws the
 *       {@link dev.dlock.LeaseLostException}.</li>
 * </ul>
 *
 * <p>The fence: inside a task, {@link #current()} gives the innermost lock this thread took, and
 * {@link DlockSimpleLock#fence()} its fencing token (send it with every write the lock protects;
 * {@link DlockSimpleLock#lease()} gives the lease, to {@code check()} between steps).
 * {@link #tryLock(LockConfiguration)} is {@link #lock(LockConfiguration)} with that type.
 */
public final class DlockLockProvider implements ExtensibleLockProvider {
    /** The resource prefix of {@link #DlockLockProvider(Locks)}. */
    public static final String DEFAULT_PREFIX = "shedlock:";

    private static final ThreadLocal<ArrayDeque<DlockSimpleLock>> TAKEN = ThreadLocal.withInitial(ArrayDeque::new);

    private final Locks locks;
    private final String prefix;
    private final HoldOptions options;

    /**
     * A provider with the resource prefix {@value #DEFAULT_PREFIX} and the default hold options.
     *
     * @param locks the client the leases are taken with (the caller closes it)
     */
    public DlockLockProvider(Locks locks) {
        this(locks, DEFAULT_PREFIX, HoldOptions.defaults());
    }

    /**
     * A provider with a resource prefix of its own and hold options (request and release
     * timeouts, a max hold, meta); their ttl and wait are replaced by {@code lockAtMostFor} and no
     * wait.
     *
     * @param locks the client the leases are taken with (the caller closes it)
     * @param prefix put before each lock's name to make its resource
     * @param options the options of each hold
     */
    public DlockLockProvider(Locks locks, String prefix, HoldOptions options) {
        this.locks = Objects.requireNonNull(locks, "locks");
        this.prefix = Objects.requireNonNull(prefix, "prefix");
        this.options = Objects.requireNonNull(options, "options");
    }

    /**
     * Takes the lock if nobody holds it, without waiting.
     *
     * @param configuration the lock's name, {@code lockAtMostFor} (the ttl) and {@code lockAtLeastFor}
     * @return the lock (a {@link DlockSimpleLock}), or empty if it is held
     * @throws NotAcquiredException if the server could not be reached or the outcome is unknown
     */
    @Override
    public Optional<SimpleLock> lock(LockConfiguration configuration) {
        return tryLock(configuration).map(SimpleLock.class::cast);
    }

    /**
     * {@link #lock(LockConfiguration)}, typed: the lock gives its fence.
     *
     * @param configuration the lock's name, {@code lockAtMostFor} (the ttl) and {@code lockAtLeastFor}
     * @return the lock, or empty if it is held
     * @throws NotAcquiredException if the server could not be reached or the outcome is unknown
     */
    public Optional<DlockSimpleLock> tryLock(LockConfiguration configuration) {
        Lease lease;
        try {
            lease = locks.hold(prefix + configuration.getName(), options.ttl(configuration.getLockAtMostFor()).noWait());
        } catch (NotAcquiredException e) {
            if (e.outcome() == NotAcquiredException.Outcome.HELD) {
                return Optional.empty();
            }
            throw e;
        }
        return Optional.of(taken(new DlockSimpleLock(configuration, lease)));
    }

    /**
     * The innermost lock this thread took through a {@code DlockLockProvider} (as ShedLock's
     * executor does, on the thread that then runs the task) and has not unlocked or extended since;
     * after an extension, the extended lock.
     *
     * @return the lock, or empty outside a locked task
     */
    public static Optional<DlockSimpleLock> current() {
        ArrayDeque<DlockSimpleLock> taken = TAKEN.get();
        while (!taken.isEmpty() && taken.peekLast().ended()) {
            taken.pollLast(); // unlocked on another thread
        }
        if (taken.isEmpty()) {
            TAKEN.remove();
            return Optional.empty();
        }
        return Optional.of(taken.peekLast());
    }

    /** Puts a lock this thread took on its stack. */
    static DlockSimpleLock taken(DlockSimpleLock lock) {
        TAKEN.get().addLast(lock);
        return lock;
    }

    /** Takes an ended lock off this thread's stack, if it is there (a lock ended on another thread is dropped by current()). */
    static void ended(DlockSimpleLock lock) {
        ArrayDeque<DlockSimpleLock> taken = TAKEN.get();
        taken.removeLastOccurrence(lock);
        if (taken.isEmpty()) {
            TAKEN.remove();
        }
    }

    @Override
    public String toString() {
        return "DlockLockProvider[prefix=" + prefix + "]";
    }
}
