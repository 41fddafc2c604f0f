package dev.dlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.dlock.testkit.Servers;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import java.time.Duration;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** The client against a Redis Cluster of three primaries the test starts. */
class ClusterTest {
    private static Servers.Cluster cluster;

    @BeforeAll
    static void start() {
        cluster = Servers.startCluster();
    }

    @AfterAll
    static void stop() {
        cluster.close();
    }

    /** The primary serving the key's slot: the node that does not answer MOVED. */
    private static Servers.Server owner(String key) {
        return cluster.owner(key);
    }

    @Test
    void aRevokedHolderHearsItOnItsShardChannel() throws Exception {
        String resource = "invoice:{11}";
        String channel = Protocol.channelName(resource);
        Servers.Server owner = owner(resource);
        RedisClient client = RedisClient.create(owner.url());
        try (Locks locks = Locks.connect(cluster.url()); StatefulRedisConnection<String, String> node = client.connect()) {
            Lease lease = locks.hold(resource, RevokeTest.LONG);
            // SSUBSCRIBE on the primary of the resource's slot.
            RevokeTest.awaitSubscribers(node, channel, true, 1);
            assertEquals(":1", owner.command("DLOCK.REVOKE", resource, "REASON", "incident 4411"));
            RevokeTest.assertRevoked(lease, lease.whenLost().toCompletableFuture().get(20, TimeUnit.SECONDS), "incident 4411");
            RevokeTest.assertRevoked(lease, assertThrows(LeaseLostException.class, lease::close), "incident 4411");
            RevokeTest.awaitSubscribers(node, channel, true, 0);
        } finally {
            client.shutdown();
        }
    }

    /**
     * The slot of a held lease moves to another primary: the old one drops the shard channel's
     * subscription (sunsubscribe), and the channel follows the slot at once, so a revocation there
     * is heard within moments (before, it was found by the next renewal, 10 s later here).
     */
    @Test
    void aHeldLeasesChannelFollowsItsSlotToItsNewPrimary() throws Exception {
        String resource = "invoice:{13}";
        String channel = Protocol.channelName(resource);
        Servers.Server from = owner(resource);
        Servers.Server to = cluster.nodes.stream().filter(n -> n != from).findFirst().orElseThrow();
        RedisClient client = RedisClient.create(from.url());
        try (Locks locks = Locks.connect(cluster.url());
                StatefulRedisConnection<String, String> oldNode = client.connect();
                StatefulRedisConnection<String, String> newNode = client.connect(RedisURI.create(to.url()))) {
            Lease lease = locks.hold(resource, RevokeTest.LONG);
            RevokeTest.awaitSubscribers(oldNode, channel, true, 1);
            cluster.moveSlot(resource, to);
            RevokeTest.awaitSubscribers(newNode, channel, true, 1);
            assertEquals(":1", to.command("DLOCK.REVOKE", resource, "REASON", "moved and revoked"));
            RevokeTest.assertRevoked(lease, lease.whenLost().toCompletableFuture().get(2, TimeUnit.SECONDS), "moved and revoked");
            RevokeTest.awaitSubscribers(newNode, channel, true, 0);
            // A lease taken after the move listens on the new primary as well, and leaves it.
            Lease next = locks.hold(resource, RevokeTest.LONG);
            RevokeTest.awaitSubscribers(newNode, channel, true, 1);
            next.close();
            RevokeTest.awaitSubscribers(newNode, channel, true, 0);
        } finally {
            client.shutdown();
        }
    }

    /**
     * The slot of a resource moves while a ticket waiter and an observer listen on its shard
     * channel: both follow it to the new primary, where the holder's release wakes the waiter (a
     * ticket's own refresh is 10 s away here) and the observer hears the new leader (its own
     * reading is 5 s away).
     */
    @Test
    void aTicketWaiterAndAnObserverFollowTheirSlotToItsNewPrimary() throws Exception {
        String resource = "queue:{8}";
        String channel = Protocol.channelName(resource);
        Servers.Server from = owner(resource);
        Servers.Server to = cluster.nodes.stream().filter(n -> n != from).findFirst().orElseThrow();
        RedisClient client = RedisClient.create(to.url());
        List<Optional<Leader>> seen = new CopyOnWriteArrayList<>();
        try (Locks locks = Locks.connect(cluster.url()); StatefulRedisConnection<String, String> newNode = client.connect()) {
            Lease holder = locks.hold(resource, HoldOptions.defaults().ttl(Duration.ofSeconds(20)).noWait());
            try (AutoCloseable observer = locks.observe(resource, seen::add)) {
                waitFor(() -> seen.stream().anyMatch(l -> l.isPresent() && l.get().token().equals(holder.token())));
                CompletableFuture<Lease> waiter = locks.holdAsync(resource,
                        HoldOptions.defaults().ttl(Duration.ofSeconds(20)).waitFor(Duration.ofSeconds(20)).tickets(Duration.ofSeconds(30)));
                waitFor(() -> locks.info(resource).map(i -> i.tickets() == 1).orElse(false));
                // The lease's key moves with the slot; the ticket does not (woken by the resubscription,
                // the waiter queues again on the new primary).
                cluster.moveSlot(resource, to);
                RevokeTest.awaitSubscribers(newNode, channel, true, 1);
                // The ticket's own shard channel (where its turn is told) follows the slot too.
                waitFor(() -> newNode.sync().pubsubShardChannels(channel + ":*").size() == 1);
                waitFor(() -> locks.info(resource).map(i -> i.tickets() == 1).orElse(false));
                long released = System.nanoTime();
                holder.close();
                try (Lease next = waiter.get(3, TimeUnit.SECONDS)) {
                    System.out.printf("ClusterTest: the ticket waiter got the lease %d ms after the release on the new primary%n",
                            (System.nanoTime() - released) / 1_000_000);
                    assertTrue(next.fence() > holder.fence());
                    long deadline = System.nanoTime() + Duration.ofSeconds(2).toNanos();
                    while (seen.stream().noneMatch(l -> l.isPresent() && l.get().token().equals(next.token()))) {
                        assertTrue(System.nanoTime() < deadline, "the observer did not report the new leader within 2 s: " + seen);
                        Thread.sleep(20);
                    }
                }
            }
        } finally {
            client.shutdown();
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

    /**
     * A set in a cluster (one hash tag) is routed by its members, not by its numkeys argument: it
     * waits with tickets on the shard channels of its slot's primary, is woken there, renewed
     * ({@code RENEWALL}) past its ttl and released whole.
     */
    @Test
    void aSetWaitsIsRenewedAndIsReleasedOnItsSlotsPrimary() throws Exception {
        Servers.Server numkeys = owner("2");
        int tag = 0;
        while (owner("{set" + tag + "}:a") == numkeys) {
            tag++;
        }
        List<String> members = List.of("{set" + tag + "}:a", "{set" + tag + "}:b");
        Servers.Server owner = owner(members.get(0));
        HoldOptions options = HoldOptions.defaults().ttl(Duration.ofMillis(600)).noWait();
        long movedBefore = moved(numkeys);
        try (Locks locks = Locks.connect(cluster.url())) {
            Lease held = locks.hold(members.get(1), options.ttl(Duration.ofSeconds(10)));
            CompletableFuture<SetLease> waiting = CompletableFuture.supplyAsync(
                    () -> locks.holdAll(members, options.waitFor(Duration.ofSeconds(6))));
            long deadline = System.nanoTime() + Duration.ofSeconds(5).toNanos();
            while (locks.info(members.get(0)).map(Info::tickets).orElse(0L) != 1) {
                assertTrue(System.nanoTime() < deadline, "the set's ticket in line");
                Thread.sleep(5);
            }
            held.release();
            long released = System.nanoTime();
            SetLease set = waiting.get(5, TimeUnit.SECONDS);
            long tookMs = (System.nanoTime() - released) / 1_000_000;
            assertTrue(tookMs < 1000, "woken by the shard channel " + tookMs + " ms after the release (its refresh: 2 s)");
            Thread.sleep(900); // past the ttl: kept by its renewals
            set.check();
            String fence = Long.toUnsignedString(set.fence(members.get(1)));
            assertEquals(":1", owner.command("DLOCK.FENCECHECK", members.get(1), fence));
            set.close();
            assertEquals(":0", owner.command("EXISTS", members.get(0), members.get(1)));
        }
        assertEquals(movedBefore, moved(numkeys), "a set's command sent to the node of its numkeys' slot");
    }

    /** How many MOVED replies the node has sent ({@code INFO errorstats}). */
    private static long moved(Servers.Server node) {
        for (String line : node.command("INFO", "errorstats").split("\r?\n")) {
            if (line.startsWith("errorstat_MOVED:count=")) {
                return Long.parseLong(line.substring("errorstat_MOVED:count=".length()).split(",")[0].trim());
            }
        }
        return 0;
    }
}
