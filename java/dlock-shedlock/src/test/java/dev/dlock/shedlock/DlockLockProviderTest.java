package dev.dlock.shedlock;

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
import dev.dlock.NotAcquiredException;
import dev.dlock.Protocol;
import dev.dlock.testkit.Servers;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.TimeUnit;
import net.javacrumbs.shedlock.core.DefaultLockingTaskExecutor;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.LockExtender;
import net.javacrumbs.shedlock.core.LockProvider;
import net.javacrumbs.shedlock.core.LockingTaskExecutor;
import net.javacrumbs.shedlock.core.SimpleLock;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * ShedLock's contract on a real server with the module ($DLOCK_SERVER or redis-server): two
 * providers on two clients, as two nodes of an application, through ShedLock's own executor.
 */
class DlockLockProviderTest {
    private static Servers.Server server;
    private static Locks nodeA;
    private static Locks nodeB;
    private static DlockLockProvider providerA;
    private static DlockLockProvider providerB;
    private static LockingTaskExecutor executorA;
    private static LockingTaskExecutor executorB;

    @BeforeAll
    static void start() throws Throwable {
        server = Servers.start();
        nodeA = Locks.connect(server.url());
        nodeB = Locks.connect(server.url());
        nodeA.info("warm-up");
        nodeB.info("warm-up");
        providerA = new DlockLockProvider(nodeA);
        providerB = new DlockLockProvider(nodeB);
        executorA = new DefaultLockingTaskExecutor(providerA);
        executorB = new DefaultLockingTaskExecutor(providerB);
        // Through ShedLock's executor once each: a cold JVM's first pass (its classes loaded) took
        // over 350 ms of lockAtLeastForKeepsTheLockAfterTheTaskEnded's 400 ms on a loaded machine.
        executorA.executeWithLock(() -> true, config("warm-up", Duration.ofSeconds(10), Duration.ZERO));
        executorB.executeWithLock(() -> true, config("warm-up", Duration.ofSeconds(10), Duration.ZERO));
    }

    @AfterAll
    static void stop() {
        nodeA.close();
        nodeB.close();
        server.close();
    }

    private static LockConfiguration config(String name, Duration atMost, Duration atLeast) {
        return new LockConfiguration(Instant.now(), name, atMost, atLeast);
    }

    private static long ttlMs(String name) {
        return nodeA.info(DlockLockProvider.DEFAULT_PREFIX + name).orElseThrow().ttlMs();
    }

    @Test
    void ofTwoProvidersOnlyOneRunsTheTaskAndTheOtherSkipsIt() throws Throwable {
        CyclicBarrier start = new CyclicBarrier(2);
        CountDownLatch loserDone = new CountDownLatch(1);
        List<String> ran = new CopyOnWriteArrayList<>();
        List<CompletableFuture<Boolean>> nodes = new ArrayList<>();
        for (String node : List.of("A", "B")) {
            LockingTaskExecutor executor = node.equals("A") ? executorA : executorB;
            nodes.add(CompletableFuture.supplyAsync(() -> {
                try {
                    start.await(5, TimeUnit.SECONDS);
                    boolean executed = executor.executeWithLock(() -> {
                        ran.add(node);
                        // Held until the other node has tried and skipped the task.
                        return loserDone.await(5, TimeUnit.SECONDS);
                    }, config("once", Duration.ofSeconds(10), Duration.ZERO)).wasExecuted();
                    if (!executed) {
                        loserDone.countDown();
                    }
                    return executed;
                } catch (Throwable e) {
                    throw new IllegalStateException(e);
                }
            }));
        }
        int executed = 0;
        for (CompletableFuture<Boolean> node : nodes) {
            executed += node.get(10, TimeUnit.SECONDS) ? 1 : 0;
        }
        assertEquals(1, executed);
        assertEquals(1, ran.size(), ran.toString());
        assertTrue(nodeA.info(DlockLockProvider.DEFAULT_PREFIX + "once").isEmpty(), "released after the task");
        assertTrue(executorB.executeWithLock(() -> true, config("once", Duration.ofSeconds(10), Duration.ZERO)).wasExecuted());
    }

    @Test
    void lockAtLeastForKeepsTheLockAfterTheTaskEnded() throws Throwable {
        LockConfiguration first = config("at-least", Duration.ofSeconds(10), Duration.ofMillis(400));
        assertTrue(executorA.executeWithLock(() -> true, first).wasExecuted());
        long left = ttlMs("at-least");
        assertTrue(left > 0 && left <= 400, "held for lockAtLeastFor, " + left + " ms left");
        assertFalse(executorB.executeWithLock(() -> true, config("at-least", Duration.ofSeconds(10), Duration.ZERO)).wasExecuted());
        Thread.sleep(Math.max(0, Duration.between(Instant.now(), first.getLockAtLeastUntil()).toMillis()) + 50);
        assertTrue(executorB.executeWithLock(() -> true, config("at-least", Duration.ofSeconds(10), Duration.ZERO)).wasExecuted());
    }

    @Test
    void lockAtMostForIsTheTtlAndTheLeaseIsRenewedWhileTheTaskRuns() throws Throwable {
        assertTrue(executorA.executeWithLock(() -> {
            long ttl = ttlMs("at-most");
            assertTrue(ttl > 0 && ttl <= 300, ttl + " ms");
            Thread.sleep(700); // more than twice lockAtMostFor
            assertTrue(providerB.lock(config("at-most", Duration.ofMillis(300), Duration.ZERO)).isEmpty());
            DlockLockProvider.current().orElseThrow().lease().check();
            return true;
        }, config("at-most", Duration.ofMillis(300), Duration.ZERO)).wasExecuted());
        assertTrue(executorB.executeWithLock(() -> true, config("at-most", Duration.ofMillis(300), Duration.ZERO)).wasExecuted());
    }

    @Test
    void aLeaseLostWhileTheTaskRanFailsTheRunAsTheCoreReportsIt() throws Throwable {
        LeaseLostException thrown = assertThrows(LeaseLostException.class, () -> executorA.executeWithLock((LockingTaskExecutor.Task) () -> {
            DlockSimpleLock lock = DlockLockProvider.current().orElseThrow();
            // The lease listens on its resource's channel once its subscription is in place, a
            // moment after the grant: a revocation published before then is heard only at the
            // next renewal, seconds later.
            String channel = Protocol.channelName(DlockLockProvider.DEFAULT_PREFIX + "revoked");
            long listening = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
            while (!server.command("PUBSUB", "CHANNELS", channel).equals("*1") && System.nanoTime() < listening) {
                Thread.sleep(5);
            }
            assertEquals(":1", server.command("DLOCK.REVOKE", DlockLockProvider.DEFAULT_PREFIX + "revoked", "REASON", "stuck"));
            LeaseLostException loss = lock.lease().whenLost().toCompletableFuture().get(2, TimeUnit.SECONDS);
            assertEquals(LossReason.REVOKED, loss.reason());
            assertThrows(LeaseLostException.class, lock.lease()::check); // what a task checking between steps sees
        }, config("revoked", Duration.ofSeconds(10), Duration.ofSeconds(5))));
        assertEquals(LossReason.REVOKED, thrown.reason());
        assertEquals("stuck", thrown.detail());
        assertTrue(DlockLockProvider.current().isEmpty());
        assertTrue(executorB.executeWithLock(() -> true, config("revoked", Duration.ofSeconds(10), Duration.ZERO)).wasExecuted(),
                "a lost lease's lockAtLeastFor keeps nothing");
    }

    @Test
    void theCurrentLockGivesTheFenceWhichGrowsWithEachGrant() throws Throwable {
        assertTrue(DlockLockProvider.current().isEmpty());
        List<Long> fences = new ArrayList<>();
        for (int run = 0; run < 2; run++) {
            executorA.executeWithLock((Runnable) () -> {
                DlockSimpleLock outer = DlockLockProvider.current().orElseThrow();
                assertEquals(nodeA.info(DlockLockProvider.DEFAULT_PREFIX + "fenced").orElseThrow().fence(), outer.fence());
                fences.add(outer.fence());
                executorA.executeWithLock((Runnable) () -> assertNotSame(outer, DlockLockProvider.current().orElseThrow()),
                        config("fenced-inner", Duration.ofSeconds(10), Duration.ZERO));
                assertSame(outer, DlockLockProvider.current().orElseThrow());
            }, config("fenced", Duration.ofSeconds(10), Duration.ZERO));
        }
        assertTrue(fences.get(1) > fences.get(0), fences.toString());
        assertTrue(DlockLockProvider.current().isEmpty());
    }

    @Test
    void extendingTheActiveLockRenewsItAndCountsLockAtLeastForFromThen() throws Throwable {
        executorA.executeWithLock((Runnable) () -> {
            DlockSimpleLock before = DlockLockProvider.current().orElseThrow();
            LockExtender.extendActiveLock(Duration.ofSeconds(10), Duration.ofMillis(400));
            DlockSimpleLock after = DlockLockProvider.current().orElseThrow();
            assertNotSame(before, after);
            assertEquals(before.fence(), after.fence());
            assertEquals(Duration.ofMillis(400), after.configuration().getLockAtLeastFor());
            assertThrows(IllegalStateException.class, before::unlock, "ShedLock's rule: an extended lock is spent");
        }, config("extended", Duration.ofSeconds(10), Duration.ZERO));
        long left = ttlMs("extended");
        assertTrue(left > 0 && left <= 400, left + " ms left");
    }

    @Test
    void anUnreachableServerIsAnErrorNotASkippedTask() {
        try (Locks nowhere = Locks.connect("redis://127.0.0.1:" + Servers.freePort())) {
            DlockLockProvider provider = new DlockLockProvider(nowhere, "jobs:", HoldOptions.defaults().requestTimeout(Duration.ofMillis(200)));
            NotAcquiredException e = assertThrows(NotAcquiredException.class,
                    () -> provider.lock(config("nowhere", Duration.ofSeconds(10), Duration.ZERO)));
            assertEquals(NotAcquiredException.Outcome.UNREACHABLE, e.outcome());
        }
    }

    @Test
    void aPrefixAndOptionsOfItsOwnNameTheResource() {
        DlockLockProvider provider = new DlockLockProvider(nodeA, "jobs:", HoldOptions.defaults().meta("node=a"));
        SimpleLock lock = provider.lock(config("prefixed", Duration.ofSeconds(10), Duration.ZERO)).orElseThrow();
        assertEquals("node=a", nodeA.info("jobs:prefixed").orElseThrow().meta());
        lock.unlock();
        assertTrue(nodeA.info("jobs:prefixed").isEmpty());
        assertThrows(IllegalStateException.class, lock::unlock);
    }

    /** Where the README's example sends its fenced write. */
    interface Report {
        void publish(long fence);
    }

    @Test
    void theReadmesExampleRunsTheTaskUnderAFence() throws Exception {
        Locks locks = nodeA;
        List<Long> published = new CopyOnWriteArrayList<>();
        Report report = published::add;
        // README:begin
        LockProvider provider = new DlockLockProvider(locks);
        LockingTaskExecutor executor = new DefaultLockingTaskExecutor(provider);
        executor.executeWithLock((Runnable) () -> {
            DlockSimpleLock lock = DlockLockProvider.current().orElseThrow();
            report.publish(lock.fence()); // send the fence with every write the lock protects
        }, new LockConfiguration(Instant.now(), "nightly-report", Duration.ofMinutes(10), Duration.ofSeconds(1)));
        // README:end
        assertEquals(1, published.size());
        assertEquals(published.get(0), nodeA.info("shedlock:nightly-report").orElseThrow().fence(), "held for lockAtLeastFor");
        assertEquals(readmeRegion(), javaBlock(), "README.md's Java block is this test's README region");
    }

    private static String javaBlock() throws Exception {
        List<String> lines = Files.readAllLines(Path.of("README.md"));
        int from = lines.indexOf("```java");
        int to = lines.subList(from + 1, lines.size()).indexOf("```") + from + 1;
        return String.join("\n", lines.subList(from + 1, to));
    }

    private static String readmeRegion() throws Exception {
        List<String> lines = Files.readAllLines(Path.of("src/test/java/dev/dlock/shedlock/DlockLockProviderTest.java"));
        int from = lines.indexOf("        // README:begin");
        int to = lines.indexOf("        // README:end");
        List<String> region = new ArrayList<>();
        for (String line : lines.subList(from + 1, to)) {
            region.add(line.startsWith("        ") ? line.substring(8) : line);
        }
        return String.join("\n", region);
    }
}
