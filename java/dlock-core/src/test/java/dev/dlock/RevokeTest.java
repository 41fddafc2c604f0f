package dev.dlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.dlock.testkit.Servers;
import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.logging.Handler;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.parallel.Execution;
import org.junit.jupiter.api.parallel.ExecutionMode;

/**
 * {@code DLOCK.REVOKE} against a real server: the holder hears of it on its resource's channel at
 * once ({@code docs/protocol.md}, section 4, "Hearing of a revocation").
 */
@Execution(ExecutionMode.SAME_THREAD)
class RevokeTest {
    /** ttl 30 s: before the first renewal (10 s) only the channel can tell the holder. */
    static final HoldOptions LONG = HoldOptions.defaults().ttl(Duration.ofSeconds(30)).noWait();

    private static Servers.Server server;
    private static RedisClient operatorClient;
    private static StatefulRedisConnection<String, String> operator;
    private static final Logger DLOCK_LOG = Logger.getLogger("dev.dlock"); // held: JUL keeps loggers weakly

    @BeforeAll
    static void start() {
        server = Servers.start();
        operatorClient = RedisClient.create(server.url());
        operator = operatorClient.connect();
    }

    @AfterAll
    static void stop() {
        operator.close();
        operatorClient.shutdown();
        server.close();
    }

    /** How many clients the server has subscribed to the channel (PUBSUB NUMSUB, or SHARDNUMSUB). */
    static long subscribers(StatefulRedisConnection<String, String> on, String channel, boolean sharded) {
        return (sharded ? on.sync().pubsubShardNumsub(channel) : on.sync().pubsubNumsub(channel)).getOrDefault(channel, 0L);
    }

    /**
     * Waits until the server counts {@code want} subscribers of the channel: the holder listens
     * before the test revokes (a revocation that races the subscription is caught by the renewal
     * instead, which these tests do not measure).
     */
    static void awaitSubscribers(StatefulRedisConnection<String, String> on, String channel, boolean sharded, long want)
            throws InterruptedException {
        long deadline = System.nanoTime() + Duration.ofSeconds(5).toNanos();
        while (subscribers(on, channel, sharded) != want) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError(channel + ": " + subscribers(on, channel, sharded) + " subscribers, not " + want);
            }
            Thread.sleep(1);
        }
    }

    /** Checks that the loss is the lease's, revoked for reason. */
    static void assertRevoked(Lease lease, LeaseLostException loss, String reason) {
        assertEquals(LossReason.REVOKED, loss.reason(), loss.toString());
        assertEquals(reason, loss.detail());
        assertEquals(lease.fence(), loss.fence());
        assertEquals(lease.resource(), loss.resource());
    }

    private static final class Seen implements Metrics {
        final List<LossReason> lost = new CopyOnWriteArrayList<>();
        final AtomicInteger releaseFailures = new AtomicInteger();

        @Override
        public void leaseLost(LossReason reason) {
            lost.add(reason);
        }

        @Override
        public void releaseFailed() {
            releaseFailures.incrementAndGet();
        }
    }

    private static final class Lines extends Handler {
        final List<String> lines = new CopyOnWriteArrayList<>();

        @Override
        public void publish(LogRecord record) {
            lines.add(record.getMessage());
        }

        @Override
        public void flush() {}

        @Override
        public void close() {}
    }

    @Test
    void aRevokedHolderLosesItsLeaseAtOnceWithTheOperatorsReason() throws Exception {
        String resource = "report:7";
        String reason = "stuck since 03:00";
        String channel = Protocol.channelName(resource);
        Seen seen = new Seen();
        Lines log = new Lines();
        DLOCK_LOG.addHandler(log);
        try (Locks locks = Locks.connect(server.url()).withMetrics(seen)) {
            int rounds = 20;
            List<Long> latencies = new ArrayList<>();
            Set<String> pubsubClients = new HashSet<>();
            for (int i = 0; i < rounds; i++) {
                Lease lease = locks.hold(resource, LONG);
                CompletableFuture<Long> lostAt = new CompletableFuture<>();
                lease.whenLost().thenRun(() -> lostAt.complete(System.nanoTime()));
                awaitSubscribers(operator, channel, false, 1);
                pubsubClients.addAll(pubsubClientIds());
                assertEquals(":1", server.command("DLOCK.REVOKE", resource, "REASON", reason));
                long replied = System.nanoTime();
                latencies.add(lostAt.get(20, TimeUnit.SECONDS) - replied);
                assertRevoked(lease, lease.whenLost().toCompletableFuture().get(), reason);
                assertTrue(lease.isLost());
                assertRevoked(lease, assertThrows(LeaseLostException.class, lease::check), reason);
                assertRevoked(lease, assertThrows(LeaseLostException.class, lease::close), reason);
                // The lease ended: the channel is left (nobody else listens there).
                awaitSubscribers(operator, channel, false, 0);
            }
            Collections.sort(latencies);
            System.out.printf("RevokeTest: from the REVOKE reply to whenLost(), %d revocations: median %.3f ms, max %.3f ms"
                    + " (negative: the loss came first)%n", rounds, latencies.get(rounds / 2) / 1e6, latencies.get(rounds - 1) / 1e6);
            assertEquals(1, pubsubClients.size(), "one pub/sub connection for every lease: " + pubsubClients);

            // run's work is interrupted at the revocation, and run reports the loss.
            AtomicBoolean interrupted = new AtomicBoolean();
            CountDownLatch working = new CountDownLatch(1);
            CompletableFuture<Object> ran = CompletableFuture.supplyAsync(() -> {
                try {
                    return locks.run(resource, LONG, lease -> {
                        working.countDown();
                        try {
                            Thread.sleep(20_000);
                        } catch (InterruptedException e) {
                            interrupted.set(true);
                            throw e;
                        }
                        return "not protected";
                    });
                } catch (Exception e) {
                    return e;
                }
            });
            assertTrue(working.await(5, TimeUnit.SECONDS));
            awaitSubscribers(operator, channel, false, 1);
            assertEquals(":1", server.command("DLOCK.REVOKE", resource, "REASON", reason));
            Object outcome = ran.get(20, TimeUnit.SECONDS);
            assertTrue(outcome instanceof LeaseLostException, "run ended with " + outcome);
            assertEquals(LossReason.REVOKED, ((LeaseLostException) outcome).reason());
            assertEquals(reason, ((LeaseLostException) outcome).detail());
            assertTrue(interrupted.get(), "the work was interrupted");

            // Counted and logged just after whenLost() completes and the work is interrupted.
            long deadline = System.nanoTime() + Duration.ofSeconds(5).toNanos();
            while ((seen.lost.size() < rounds + 1 || lossLines(log) < rounds + 1) && System.nanoTime() < deadline) {
                Thread.sleep(1);
            }
            assertEquals(Collections.nCopies(rounds + 1, LossReason.REVOKED), seen.lost);
            // No RELEASE followed a revocation (the lease was gone), and none was counted as failed.
            assertEquals(0, serverCount("release_ok") + serverCount("release_not_owner"), "a RELEASE after a revocation");
            assertEquals(0, seen.releaseFailures.get());
            assertEquals(rounds + 1, serverCount("leases_revoked"));
            assertEquals(rounds + 1, lossLines(log), log.lines.toString());
            assertTrue(log.lines.stream().allMatch(l -> !l.startsWith("dlock: lease lost ")
                    || l.endsWith("reason=revoked detail=stuck since 03:00")), log.lines.toString());
        } finally {
            DLOCK_LOG.removeHandler(log);
        }
    }

    @Test
    void aRevocationOfAnotherLeaseLeavesTheHolderAlone() throws Exception {
        String resource = "doc";
        try (Locks locks = Locks.connect(server.url())) {
            // Three readers of one lock, through one Locks: one channel, three watchers.
            Lease holder = locks.read(resource, LONG);
            Lease other = locks.read(resource, LONG);
            Lease last = locks.read(resource, LONG);
            awaitSubscribers(operator, Protocol.channelName(resource), false, 1);
            for (Lease revoked : List.of(other, last)) {
                assertEquals(":1", server.command("DLOCK.REVOKE", resource, "FENCE", Long.toUnsignedString(revoked.fence())));
            }
            // The messages are delivered in order: once the last revoked reader knows, the first
            // message was delivered too.
            assertRevoked(last, last.whenLost().toCompletableFuture().get(20, TimeUnit.SECONDS), "");
            assertRevoked(other, assertThrows(LeaseLostException.class, other::check), "");
            assertFalse(holder.isLost(), "the holder was touched by another reader's revocation");
            assertTrue(holder.renew());
            holder.close();
            awaitSubscribers(operator, Protocol.channelName(resource), false, 0);
        }
    }

    private static long lossLines(Lines log) {
        return log.lines.stream().filter(l -> l.startsWith("dlock: lease lost ")).count();
    }

    /** The ids of the server's clients subscribed to something (CLIENT LIST TYPE pubsub). */
    private static List<String> pubsubClientIds() {
        List<String> ids = new ArrayList<>();
        for (String line : server.command("CLIENT", "LIST", "TYPE", "pubsub").split("\r?\n")) {
            if (line.startsWith("id=")) {
                ids.add(line.substring(3, line.indexOf(' ')));
            }
        }
        return ids;
    }

    /** A counter of the module's INFO section ({@code INFO dlock}). */
    private static long serverCount(String name) {
        for (String line : server.command("INFO", "dlock").split("\r?\n")) {
            if (line.startsWith("dlock_" + name + ":")) {
                return Long.parseLong(line.substring("dlock_".length() + name.length() + 1).trim());
            }
        }
        throw new AssertionError("no " + name + " in INFO dlock");
    }
}
