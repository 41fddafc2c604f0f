package dev.dlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.dlock.testkit.Proxy;
import dev.dlock.testkit.Servers;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisConnectionException;
import io.lettuce.core.RedisURI;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * dlock's own connections (a blocking wait's, the channels', a release's) open within the
 * RedisURI's timeout, which is the connect timeout; the request timeout starts once they are open.
 * Each test puts a proxy between the client and a real server that holds new connections back.
 */
class SideConnectionsTest {
    private static Servers.Server server;
    private static RedisClient client;

    @BeforeAll
    static void start() {
        server = Servers.start();
        client = RedisClient.create();
    }

    @AfterAll
    static void stop() {
        client.shutdown();
        server.close();
    }

    private static Locks locksThrough(Proxy proxy, Duration connectTimeout) {
        RedisURI uri = RedisURI.create(proxy.url());
        uri.setTimeout(connectTimeout);
        Locks locks = Locks.create(client, uri);
        locks.info("warm-up"); // the shared connection is open before any connection is held back
        return locks;
    }

    @Test
    void aWaitsConnectionSlowerToOpenThanTheRequestTimeoutStillWaits() throws Exception {
        try (Proxy proxy = new Proxy(server.port); Locks locks = locksThrough(proxy, Duration.ofSeconds(3))) {
            Lease holder = locks.hold("slow-open", HoldOptions.defaults().noWait());
            proxy.holdNewConnections(Duration.ofMillis(700)); // longer than the request timeout below
            CompletableFuture<Lease> waiter = locks.holdAsync("slow-open",
                    HoldOptions.defaults().requestTimeout(Duration.ofMillis(200)).waitFor(Duration.ofSeconds(6)));
            waitFor(() -> locks.info("slow-open").orElseThrow().waiters() == 1, Duration.ofSeconds(4));
            holder.close();
            try (Lease next = waiter.get(3, TimeUnit.SECONDS)) {
                assertEquals(next.token(), locks.info("slow-open").orElseThrow().owner());
            }
        }
    }

    @Test
    void aConnectionThatNeverOpensIsGivenUpAtTheUrisTimeoutNotTheRequests() throws Exception {
        try (Proxy proxy = new Proxy(server.port); Locks locks = locksThrough(proxy, Duration.ofMillis(500))) {
            proxy.holdNewConnections(Duration.ofHours(1));
            long started = System.nanoTime();
            Exception failure = assertThrows(Exception.class, () -> locks.transport().alone("never-open",
                    Protocol.releaseArgs("never-open", "t", 0), Duration.ofSeconds(10)));
            long took = (System.nanoTime() - started) / 1_000_000;
            assertTrue(failure instanceof RedisConnectionException, "failed with " + failure);
            assertTrue(Transport.notSent(failure), "nothing was sent on a connection that never opened");
            assertTrue(took >= 450 && took < 1_500, "gave up after " + took + " ms (the URI's timeout is 500 ms)");
        }
    }

    @Test
    void aTicketWaiterWhoseChannelCannotOpenEndsWithAnOutcome() throws Exception {
        try (Proxy proxy = new Proxy(server.port); Locks locks = locksThrough(proxy, Duration.ofMillis(300))) {
            try (Lease holder = locks.hold("no-channel", HoldOptions.defaults().noWait())) {
                proxy.holdNewConnections(Duration.ofHours(1));
                // The subscription connection never opens: the attempt ends with one of its outcomes
                // (a DlockException), never with Lettuce's connection exception.
                assertThrows(NotAcquiredException.class, () -> locks.hold("no-channel",
                        HoldOptions.defaults().requestTimeout(Duration.ofMillis(200)).waitFor(Duration.ofMillis(500))
                                .tickets(Duration.ofSeconds(6))));
                assertEquals(holder.token(), locks.info("no-channel").orElseThrow().owner());
            }
        }
    }

    private static void waitFor(java.util.function.BooleanSupplier condition, Duration limit) throws InterruptedException {
        long deadline = System.nanoTime() + limit.toNanos();
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("condition not met in " + limit);
            }
            Thread.sleep(20);
        }
    }
}
