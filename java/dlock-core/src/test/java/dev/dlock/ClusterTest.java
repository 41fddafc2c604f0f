package dev.dlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import dev.dlock.testkit.Servers;
import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
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
        return cluster.nodes.stream().filter(n -> !n.command("DLOCK.INFO", key).startsWith("-MOVED")).findFirst()
                .orElseThrow();
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
}
