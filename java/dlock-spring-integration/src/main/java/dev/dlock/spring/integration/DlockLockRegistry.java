package dev.dlock.spring.integration;

import dev.dlock.HoldOptions;
import dev.dlock.Locks;
import java.util.Objects;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentMap;
import org.springframework.integration.support.locks.ExpirableLockRegistry;

/**
 * Spring Integration's {@code LockRegistry} on dlock leases: {@link #obtain(Object)} gives the
 * {@link DlockLock} of a key, whose outermost hold is an exclusive lease on the resource
 * {@code registryKey:key} with a fencing token, renewed on the {@link Locks}' scheduler thread
 * while it is held. It stands in for {@code RedisLockRegistry} (same key layout, same contract):
 * switching is the one bean definition of the {@code LockRegistry}.
 *
 * <pre>{@code
 * @Bean
 * public LockRegistry<?> lockRegistry(@Value("${dlock.url}") String url) {
 *     return DlockLockRegistry.connect(url, "invoices");
 * }
 * }</pre>
 *
 * The same key gives the same lock object until {@link #expireUnusedOlderThan(long)} forgets it
 * (never while it is held).
 */
public final class DlockLockRegistry implements ExpirableLockRegistry<DlockLock>, AutoCloseable {
    private final Locks locks;
    private final boolean ownsLocks;
    private final String registryKey;
    private final HoldOptions options;
    private final ConcurrentMap<String, DlockLock> cache = new ConcurrentHashMap<>();

    /**
     * A registry on the caller's {@link Locks} (which the caller closes), with the default hold
     * options (a ttl of 30 s, renewed every 10 s).
     *
     * @param locks where the leases are taken
     * @param registryKey the prefix of every resource: {@code registryKey:key}
     */
    public DlockLockRegistry(Locks locks, String registryKey) {
        this(locks, registryKey, HoldOptions.defaults());
    }

    /**
     * A registry on the caller's {@link Locks} with hold options of its own (ttl, timeouts,
     * {@code maxHold}, {@code meta}; the wait is each call's: {@code lock()} waits for ever,
     * {@code tryLock()} not at all, {@code tryLock(time, unit)} that long).
     *
     * @param locks where the leases are taken
     * @param registryKey the prefix of every resource: {@code registryKey:key}
     * @param options the leases' options
     */
    public DlockLockRegistry(Locks locks, String registryKey, HoldOptions options) {
        this(locks, false, registryKey, options);
    }

    private DlockLockRegistry(Locks locks, boolean ownsLocks, String registryKey, HoldOptions options) {
        this.locks = Objects.requireNonNull(locks, "locks");
        this.ownsLocks = ownsLocks;
        this.registryKey = Objects.requireNonNull(registryKey, "registryKey");
        this.options = Objects.requireNonNull(options, "options");
    }

    /**
     * A registry with a {@link Locks} of its own ({@link Locks#connect(String)}), closed with it:
     * what a single bean definition needs (Spring calls {@link #close()} when the context closes).
     *
     * @param url {@code redis://host:port}, or a cluster's seeds separated by commas
     * @param registryKey the prefix of every resource: {@code registryKey:key}
     * @return the registry
     */
    public static DlockLockRegistry connect(String url, String registryKey) {
        return new DlockLockRegistry(Locks.connect(url), true, registryKey, HoldOptions.defaults());
    }

    /**
     * The lock of {@code lockKey}: the same object for the same key while it is cached.
     *
     * @param lockKey the lock's key, a {@code String}
     * @return its lock
     * @throws IllegalArgumentException if the key is not a String
     */
    @Override
    public DlockLock obtain(Object lockKey) {
        if (!(lockKey instanceof String key)) {
            throw new IllegalArgumentException("a dlock lock key is a String, not " + lockKey);
        }
        DlockLock lock = cache.computeIfAbsent(key, k -> new DlockLock(locks, registryKey + ":" + k, options));
        lock.touch();
        return lock;
    }

    /**
     * Forgets the locks that no thread holds and that were last obtained, locked or unlocked more
     * than {@code age} milliseconds ago; a later {@link #obtain(Object)} makes a new one.
     *
     * @param age milliseconds
     */
    @Override
    public void expireUnusedOlderThan(long age) {
        long now = System.currentTimeMillis();
        cache.values().removeIf(lock -> !lock.isLocked() && now - lock.lastUsed() > age);
    }

    /** Closes the {@link Locks} if {@link #connect(String, String)} made it (its held leases are lost and released). */
    @Override
    public void close() {
        if (ownsLocks) {
            locks.close();
        }
    }

    @Override
    public String toString() {
        return "DlockLockRegistry[" + registryKey + "]";
    }
}
