package dev.dlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.dlock.testkit.Servers;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.logging.Handler;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.parallel.Execution;
import org.junit.jupiter.api.parallel.ExecutionMode;

/**
 * How a loss is named and counted ({@code docs/protocol.md}, sections 3, 4 and 5): {@code stalled}
 * when the renewal thread did not run in time, {@code unreachable} when a renewal went unanswered;
 * a release failure only for a lease still believed live.
 */
@Execution(ExecutionMode.SAME_THREAD)
class LossTest {
    private static final Logger DLOCK_LOG = Logger.getLogger("dev.dlock"); // held: JUL keeps loggers weakly
    private static Servers.Server server;

    private final Seen seen = new Seen();
    private final Lines log = new Lines();
    private Locks locks;

    @BeforeAll
    static void start() {
        server = Servers.start();
    }

    @AfterAll
    static void stop() {
        server.close();
    }

    @BeforeEach
    void connect() {
        DLOCK_LOG.addHandler(log);
        locks = Locks.connect(server.url()).withMetrics(seen);
        locks.info("warm-up"); // connected: a short lease granted now is not lost to the first connection's cost
    }

    @AfterEach
    void close() {
        locks.close();
        DLOCK_LOG.removeHandler(log);
    }

    static final class Seen implements Metrics {
        final List<LossReason> lost = new CopyOnWriteArrayList<>();
        final List<String> renewalFailures = new CopyOnWriteArrayList<>();
        final AtomicInteger releaseFailures = new AtomicInteger();

        @Override
        public void leaseLost(LossReason reason) {
            lost.add(reason);
        }

        @Override
        public void renewalFailed(String reason) {
            renewalFailures.add(reason);
        }

        @Override
        public void releaseFailed() {
            releaseFailures.incrementAndGet();
        }
    }

    static final class Lines extends Handler {
        final List<String> lines = new CopyOnWriteArrayList<>();

        @Override
        public void publish(LogRecord record) {
            lines.add(record.getMessage());
        }

        @Override
        public void flush() {}

        @Override
        public void close() {}

        long starting(String prefix) {
            return lines.stream().filter(l -> l.startsWith(prefix)).count();
        }
    }

    /** Waits until n losses were counted and logged: whenLost() may complete just before. */
    private void counted(int n) throws InterruptedException {
        long deadline = System.nanoTime() + Duration.ofSeconds(2).toNanos();
        while ((seen.lost.size() < n || log.starting("dlock: lease lost ") < n) && System.nanoTime() < deadline) {
            Thread.sleep(1);
        }
    }

    @Test
    void aBlockedRenewalThreadIsStalledNotUnreachable() throws Exception {
        HoldOptions options = HoldOptions.defaults().ttl(Duration.ofMillis(600)).noWait();
        Lease watched = locks.hold("stalled-watched", options);
        Lease closed = locks.hold("stalled-closed", options);
        // The Locks' one renewal thread is blocked for twice the ttl (as by a long collector pause):
        // no renewal is sent, the server stays reachable and its leases expire.
        CountDownLatch blocked = new CountDownLatch(1);
        locks.scheduler().execute(() -> {
            blocked.countDown();
            long until = System.nanoTime() + Duration.ofMillis(1_200).toNanos();
            while (System.nanoTime() - until < 0) {
                try {
                    Thread.sleep(Math.max(1, (until - System.nanoTime()) / 1_000_000));
                } catch (InterruptedException e) {
                    return;
                }
            }
        });
        assertTrue(blocked.await(1, TimeUnit.SECONDS));
        Thread.sleep(800); // past the ttl, the renewal thread still blocked
        assertTrue(locks.info("stalled-closed").isEmpty(), "the server let the lease expire");
        // The expiry is checked before the RELEASE: the loss is what close() reports, not a release
        // that found the lease gone (ended, counted as a release failure before).
        assertEquals(LossReason.STALLED, assertThrows(LeaseLostException.class, closed::close).reason());
        // The renewal thread runs again: the renewal it finds due after the local expiry is not sent.
        assertEquals(LossReason.STALLED, watched.whenLost().toCompletableFuture().get(2, TimeUnit.SECONDS).reason());
        counted(2);
        assertEquals(List.of(LossReason.STALLED, LossReason.STALLED), seen.lost);
        assertEquals(List.of(), seen.renewalFailures, "a renewal sent after the local expiry would be refused");
        assertEquals(0, seen.releaseFailures.get());
        assertEquals(2, log.starting("dlock: lease lost "), log.lines.toString());
        assertTrue(log.lines.stream().noneMatch(l -> l.startsWith("dlock: lease lost ") && !l.contains("reason=stalled")),
                log.lines.toString());
    }

    @Test
    void aPausedServerIsUnreachableNotStalled() throws Exception {
        Lease lease = locks.hold("paused", HoldOptions.defaults().ttl(Duration.ofMillis(600))
                .requestTimeout(Duration.ofMillis(200)).noWait());
        server.pause(); // the process runs, its renewals go unanswered
        try {
            LeaseLostException loss = lease.whenLost().toCompletableFuture().get(2, TimeUnit.SECONDS);
            assertEquals(LossReason.UNREACHABLE, loss.reason());
            assertTrue(System.nanoTime() - lease.localExpiryNanos() >= 0, "lost before the local expiry");
            assertTrue(seen.renewalFailures.contains("error"), seen.renewalFailures.toString());
            counted(1);
            assertEquals(List.of(LossReason.UNREACHABLE), seen.lost);
        } finally {
            server.resume();
        }
    }

    @Test
    void aLeaseLostThenReleasedIsNoReleaseFailure() throws Exception {
        HoldOptions options = HoldOptions.defaults().ttl(Duration.ofMillis(900)).noWait();
        // Deleted by an operator, the renewal refused, then released.
        Lease refused = locks.hold("lost-refused", options);
        server.command("DEL", "lost-refused");
        assertEquals(LossReason.RENEWAL_REFUSED, refused.whenLost().toCompletableFuture().get(2, TimeUnit.SECONDS).reason());
        assertEquals(LossReason.RENEWAL_REFUSED, assertThrows(LeaseLostException.class, refused::close).reason());
        // Deleted, then released before a renewal noticed: the RELEASE answered 0 is the loss `ended`.
        Lease ended = locks.hold("lost-ended", options);
        server.command("DEL", "lost-ended");
        assertEquals(LossReason.ENDED, assertThrows(LeaseLostException.class, ended::close).reason());
        // Revoked, then released.
        Lease revoked = locks.hold("lost-revoked", options);
        io.lettuce.core.RedisClient operator = io.lettuce.core.RedisClient.create(server.url());
        try (var node = operator.connect()) {
            RevokeTest.awaitSubscribers(node, Protocol.channelName("lost-revoked"), false, 1); // heard, not refused
        } finally {
            operator.shutdown();
        }
        assertEquals(":1", server.command("DLOCK.REVOKE", "lost-revoked"));
        revoked.whenLost().toCompletableFuture().get(2, TimeUnit.SECONDS);
        assertEquals(LossReason.REVOKED, assertThrows(LeaseLostException.class, revoked::close).reason());
        counted(3);
        Thread.sleep(100); // the best-effort RELEASE after the refusal has its answer
        assertEquals(List.of(LossReason.RENEWAL_REFUSED, LossReason.ENDED, LossReason.REVOKED), seen.lost);
        assertEquals(0, seen.releaseFailures.get());
        assertEquals(0, log.starting("dlock: release failed"), log.lines.toString());
        assertEquals(3, log.starting("dlock: lease lost "), log.lines.toString());
    }

    @Test
    void anUnansweredReleaseOfALiveLeaseIsAReleaseFailure() throws Exception {
        Lease lease = locks.hold("unanswered", HoldOptions.defaults().ttl(Duration.ofSeconds(10))
                .requestTimeout(Duration.ofMillis(200)).noWait());
        server.pause();
        try {
            assertThrows(NotReleasedException.class, lease::close);
        } finally {
            server.resume();
        }
        assertEquals(1, seen.releaseFailures.get());
        assertEquals(1, log.starting("dlock: release failed"), log.lines.toString());
        assertEquals(List.of(), seen.lost);
        server.command("DEL", "unanswered"); // its 10 s ttl is no other test's business
    }
}
