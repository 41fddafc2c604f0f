package dev.dlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.dlock.testkit.Proxy;
import dev.dlock.testkit.Servers;
import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.parallel.Execution;
import org.junit.jupiter.api.parallel.ExecutionMode;

/**
 * Tickets told of their turn on their own channel ({@code NOTIFY}; {@code docs/protocol.md},
 * section 2, Tickets), against a real server: the lease starts on the message, and a server that
 * does not know the option is waited on through the resource's channel.
 */
@Execution(ExecutionMode.SAME_THREAD)
class TicketsTest {
    private static Servers.Server server;
    private static RedisClient operatorClient;
    private static StatefulRedisConnection<String, String> operator;
    private static Locks direct;

    @BeforeAll
    static void start() {
        server = Servers.start();
        operatorClient = RedisClient.create(server.url());
        operator = operatorClient.connect();
        direct = Locks.connect(server.url());
    }

    @AfterAll
    static void stop() {
        direct.close();
        operator.close();
        operatorClient.shutdown();
        server.close();
    }

    /** How many calls of {@code command} the server has run ({@code INFO commandstats}). */
    private static long calls(String command) {
        String prefix = "cmdstat_" + command + ":calls=";
        for (String line : operator.sync().info("commandstats").split("\r?\n")) {
            if (line.startsWith(prefix)) {
                return Long.parseLong(line.substring(prefix.length()).split(",", 2)[0]);
            }
        }
        return 0;
    }

    /** How many channels matching {@code pattern} have subscribers. */
    private static int channels(String pattern) {
        return operator.sync().pubsubChannels(pattern).size();
    }

    /** DLOCK.INFO read straight from the server (not through a test's proxy). */
    private static Info info(String resource) {
        return direct.info(resource).orElseThrow(() -> new AssertionError("nothing on " + resource));
    }

    private static void waitFor(String what, java.util.function.BooleanSupplier condition) throws InterruptedException {
        long deadline = System.nanoTime() + Duration.ofSeconds(5).toNanos();
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError(what + ": not within 5 s");
            }
            Thread.sleep(5);
        }
    }

    /**
     * Told of its grant on its own channel, a ticket starts on that message: no ACQUIRE claims
     * the turn; its claim (one RENEW, sent at once without the caller asking) gives the server's
     * lease the full ttl, and until that claim's answer is read (held back here by a slow way
     * back) the lease's local expiry is the claim window counted from a request sent before the
     * grant; the first renewal is that answer.
     */
    @Test
    void aTicketStartsOnItsOwnMessageAndItsClaimIsTheFirstRenewal() throws Exception {
        Duration ticket = Duration.ofSeconds(15); // refreshed every 5 s: the message, not a refresh, hands the turn over
        Duration ttl = Duration.ofSeconds(60);
        try (Proxy proxy = new Proxy(server.port); Locks locks = Locks.connect(proxy.url())) {
            locks.info("warm-up");
            assertTrue(server.command("DLOCK.ACQUIRE", "gate", "holder", "30000").startsWith(":"), "held");
            CompletableFuture<Lease> waiter =
                    locks.holdAsync("gate", HoldOptions.defaults().ttl(ttl).waitFor(Duration.ofSeconds(20)).tickets(ticket));
            waitFor("the ticket in line", () -> info("gate").tickets() == 1);
            waitFor("the ticket's own channel", () -> channels("dlock:{gate}:*") == 1);
            assertEquals(0, RevokeTest.subscribers(operator, "dlock:{gate}", false), "not the resource's channel");
            Thread.sleep(100); // the first ACQUIRE answered
            long acquires = calls("dlock.acquire");
            long renewals = calls("dlock.renew");
            proxy.delayReplies(Duration.ofMillis(1_000)); // the claim's answer comes back late
            long released = System.nanoTime();
            assertEquals(":1", server.command("DLOCK.RELEASE", "gate", "holder"), "released");
            Lease lease = waiter.get(5, TimeUnit.SECONDS);
            long window = lease.localExpiryNanos() - released;
            assertTrue(window <= ticket.toNanos(), "the claim window, not the ttl, until the claim is read: " + window);
            assertTrue(window > ticket.toNanos() - Duration.ofSeconds(3).toNanos(), "the window from before the grant: " + window);
            assertEquals(acquires, calls("dlock.acquire"), "no ACQUIRE to claim the turn");
            // The claim went out without being asked for: the server's lease runs the full ttl.
            waitFor("claimed", () -> info("gate").ttlMs() > ticket.toMillis());
            assertEquals(Long.valueOf(lease.fence()), info("gate").fence());
            assertEquals(lease.token(), info("gate").owner());
            // The first renewal reads the claim's answer: the full ttl from the claim's send.
            waitFor("the claim's answer read", () -> lease.localExpiryNanos() - System.nanoTime()
                    > ttl.minus(Duration.ofSeconds(3)).toNanos());
            assertEquals(renewals + 1, calls("dlock.renew"), "the claim was the one renewal");
            assertEquals(acquires, calls("dlock.acquire"), "still no ACQUIRE");
            proxy.delayReplies(Duration.ZERO);
            lease.check();
            lease.release();
        }
    }

    /**
     * A server that does not know {@code NOTIFY} (played by a proxy that renames the option on
     * its way in and the server's complaint on its way out) is waited on through the resource's
     * channel: the waiter subscribes there (and to no ticket's channel), is woken by the
     * {@code handoff} naming its tag and claims with an ACQUIRE, as before the option; the client
     * asks with {@code NOTIFY} once, and no more.
     */
    @Test
    void aServerWithoutNotifyIsWaitedOnThroughTheResourcesChannel() throws Exception {
        try (Proxy proxy = new Proxy(server.port); Locks locks = Locks.connect(proxy.url())) {
            proxy.rewrite(false, "$6\r\nNOTIFY\r\n", "$6\r\nXOTIFY\r\n");
            proxy.rewrite(true, "'XOTIFY'", "'NOTIFY'");
            HoldOptions options = HoldOptions.defaults().ttl(Duration.ofSeconds(30)).waitFor(Duration.ofSeconds(20))
                    .tickets(Duration.ofSeconds(9));
            for (int round = 0; round < 2; round++) {
                assertTrue(server.command("DLOCK.ACQUIRE", "old", "holder", "30000").startsWith(":"), "held");
                CompletableFuture<Lease> waiter = locks.holdAsync("old", options);
                waitFor("the ticket in line", () -> info("old").tickets() == 1);
                RevokeTest.awaitSubscribers(operator, "dlock:{old}", false, 1);
                assertEquals(0, channels("dlock:{old}:*"), "no ticket's own channel");
                assertEquals(1, proxy.rewritten(false), "round " + round + ": asked with NOTIFY once, and no more");
                Thread.sleep(300);
                long released = System.nanoTime();
                assertEquals(":1", server.command("DLOCK.RELEASE", "old", "holder"), "released");
                try (Lease lease = waiter.get(5, TimeUnit.SECONDS)) {
                    long woke = (System.nanoTime() - released) / 1_000_000;
                    assertTrue(woke < 1_000, "round " + round + ": by the channel, not the refresh: " + woke + " ms");
                    assertTrue(lease.localExpiryNanos() - System.nanoTime() > Duration.ofSeconds(20).toNanos(), "claimed by ACQUIRE");
                }
            }
            assertEquals(1, proxy.rewritten(false), "NOTIFY not sent again");
        }
    }
}
