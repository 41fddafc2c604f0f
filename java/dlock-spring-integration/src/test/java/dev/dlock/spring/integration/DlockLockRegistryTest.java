package dev.dlock.spring.integration;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.dlock.HoldOptions;
import dev.dlock.LeaseLostException;
import dev.dlock.Locks;
import dev.dlock.LossReason;
import dev.dlock.testkit.Servers;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.parallel.Execution;
import org.junit.jupiter.api.parallel.ExecutionMode;
import org.springframework.integration.support.locks.LockRegistry;

/** The registry against a real server: two registries on two clients stand for two nodes. */
@Execution(ExecutionMode.SAME_THREAD)
class DlockLockRegistryTest {
    private static final HoldOptions SHORT = HoldOptions.defaults().ttl(Duration.ofMillis(600));
    private static Servers.Server server;
    private static Locks nodeA;
    private static Locks nodeB;
    private static DlockLockRegistry registryA;
    private static DlockLockRegistry registryB;

    @BeforeAll
    static void start() {
        server = Servers.start();
        nodeA = Locks.connect(server.url());
        nodeB = Locks.connect(server.url());
        nodeA.info("warm-up"); // connected: a 600 ms lease granted now is not lost to the first connection's cost
        nodeB.info("warm-up");
        registryA = new DlockLockRegistry(nodeA, "orders", SHORT);
        registryB = new DlockLockRegistry(nodeB, "orders", SHORT);
    }

    @AfterAll
    static void stop() {
        nodeA.close();
        nodeB.close();
        server.close();
    }

    @Test
    void aLockHeldOnOneNodeIsNotGrantedOnAnotherUntilUnlocked() throws Exception {
        DlockLock a = registryA.obtain("1");
        DlockLock b = registryB.obtain("1");
        a.lock();
        long first = a.fence();
        assertEquals(first, nodeA.info("orders:1").orElseThrow().fence(), "the resource is registryKey:key");
        assertFalse(b.tryLock());
        long started = System.nanoTime();
        assertFalse(b.tryLock(100, TimeUnit.MILLISECONDS));
        assertTrue(System.nanoTime() - started >= 95_000_000L, "tryLock waited its time");
        a.unlock();
        assertTrue(b.tryLock());
        assertTrue(b.fence() > first, "a later grant has a larger fence");
        b.unlock();
        assertTrue(nodeA.info("orders:1").isEmpty(), "released");
    }

    @Test
    void lockWaitsForTheOtherNodesUnlockAndIsRenewedPastItsTtl() throws Exception {
        DlockLock a = registryA.obtain("2");
        a.lock();
        CountDownLatch waiting = new CountDownLatch(1);
        CompletableFuture<Long> fence = CompletableFuture.supplyAsync(() -> {
            DlockLock b = registryB.obtain("2");
            waiting.countDown();
            b.lock();
            try {
                return b.fence();
            } finally {
                b.unlock();
            }
        });
        assertTrue(waiting.await(2, TimeUnit.SECONDS));
        Thread.sleep(800); // past the 600 ms ttl: renewals keep A's lease, B waits
        assertFalse(fence.isDone());
        assertTrue(a.lease().fenceCheck());
        long unlocked = System.nanoTime();
        a.unlock();
        assertTrue(fence.get(2, TimeUnit.SECONDS) > 0);
        assertTrue(System.nanoTime() - unlocked < 1_000_000_000L, "B was granted at the release, not later");
    }

    @Test
    void itIsReentrantAndExcludesTheProcesssOtherThreads() throws Exception {
        DlockLock lock = registryA.obtain("3");
        assertSame(lock, registryA.obtain("3"));
        lock.lock();
        assertTrue(lock.tryLock(100, TimeUnit.MILLISECONDS)); // nested: the same lease
        long fence = lock.fence();
        assertFalse(CompletableFuture.supplyAsync(lock::tryLock).get(2, TimeUnit.SECONDS), "another thread");
        assertThrows(IllegalMonitorStateException.class,
                () -> rethrow(CompletableFuture.runAsync(lock::unlock)), "unlock by a thread that does not hold it");
        lock.unlock();
        assertEquals(fence, nodeA.info("orders:3").orElseThrow().fence(), "still held after the inner unlock");
        lock.unlock();
        assertTrue(nodeA.info("orders:3").isEmpty());
        assertThrows(IllegalMonitorStateException.class, lock::unlock);
        assertThrows(IllegalMonitorStateException.class, lock::fence);
        assertThrows(UnsupportedOperationException.class, lock::newCondition);
        assertThrows(IllegalArgumentException.class, () -> registryA.obtain(3));
    }

    @Test
    void anInterruptedLockInterruptiblyLeavesNothingHeldOrInLine() throws Exception {
        DlockLock a = registryA.obtain("4");
        a.lock();
        CompletableFuture<Throwable> outcome = new CompletableFuture<>();
        Thread waiter = new Thread(() -> {
            try {
                registryB.obtain("4").lockInterruptibly();
                outcome.complete(null);
            } catch (Throwable e) {
                outcome.complete(e);
            }
        });
        waiter.start();
        waitFor(() -> nodeA.info("orders:4").orElseThrow().waiters() == 1);
        waiter.interrupt();
        assertTrue(outcome.get(5, TimeUnit.SECONDS) instanceof InterruptedException, "ended with " + outcome.join());
        waitFor(() -> nodeA.info("orders:4").orElseThrow().waiters() == 0);
        a.unlock();
        assertTrue(registryB.obtain("4").tryLock(), "B's local lock was given back");
        registryB.obtain("4").unlock();
    }

    @Test
    void aLeaseLostWhileHeldIsReportedByUnlockWhichFreesTheLock() throws Exception {
        DlockLock lock = registryA.obtain("5");
        lock.lock();
        server.command("DEL", "orders:5");
        assertEquals(LossReason.RENEWAL_REFUSED, lock.lease().whenLost().toCompletableFuture().get(2, TimeUnit.SECONDS).reason());
        assertThrows(LeaseLostException.class, lock.lease()::check);
        assertEquals(LossReason.RENEWAL_REFUSED, assertThrows(LeaseLostException.class, lock::unlock).reason());
        assertFalse(lock.isHeldByCurrentThread());
        assertTrue(CompletableFuture.supplyAsync(() -> {
            boolean taken = lock.tryLock();
            lock.unlock();
            return taken;
        }).get(2, TimeUnit.SECONDS));
    }

    @Test
    void unusedLocksExpireHeldOnesStay() throws Exception {
        DlockLock idle = registryA.obtain("6");
        DlockLock held = registryA.obtain("7");
        held.lock();
        Thread.sleep(20);
        registryA.expireUnusedOlderThan(10);
        assertNotSame(idle, registryA.obtain("6"));
        assertSame(held, registryA.obtain("7"));
        held.unlock();
    }

    @Test
    void springsExecuteLockedRunsUnderTheLockAndItsFence() throws Exception {
        LockRegistry<?> registry = registryA;
        long fence = registry.executeLocked("8", () -> {
            assertFalse(registryB.obtain("8").tryLock(), "held on the other node");
            return registryA.obtain("8").fence(); // the same lock object, held by this thread
        });
        assertTrue(fence > 0);
        assertTrue(nodeA.info("orders:8").isEmpty());
        assertThrows(java.util.concurrent.TimeoutException.class, () -> {
            registryB.obtain("9").lock();
            try {
                registry.executeLocked("9", Duration.ofMillis(100), () -> {});
            } finally {
                registryB.obtain("9").unlock();
            }
        });
    }

    private static void rethrow(CompletableFuture<?> future) throws Throwable {
        try {
            future.get(2, TimeUnit.SECONDS);
        } catch (java.util.concurrent.ExecutionException e) {
            throw e.getCause();
        }
    }

    private static void waitFor(java.util.function.BooleanSupplier condition) throws InterruptedException {
        long deadline = System.nanoTime() + Duration.ofSeconds(5).toNanos();
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("condition not met in 5 s");
            }
            Thread.sleep(20);
        }
    }
}
