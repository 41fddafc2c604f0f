package dev.dlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.dlock.testkit.Servers;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisCommandTimeoutException;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.output.IntegerOutput;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.ProtocolKeyword;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import org.junit.jupiter.api.Test;

/**
 * What Lettuce's defaults do to DLOCK.ACQUIRE ... WAIT (README: "Timeouts"), measured against a lock
 * another client holds, next to what this client does.
 */
class TimeoutsTest {
    private static final ProtocolKeyword ACQUIRE = new ProtocolKeyword() {
        @Override
        public byte[] getBytes() {
            return "DLOCK.ACQUIRE".getBytes(StandardCharsets.US_ASCII);
        }

        @Override
        public String toString() {
            return "DLOCK.ACQUIRE";
        }
    };

    private static long dlockStat(Servers.Server server, String field) {
        for (String line : server.command("INFO", "dlock").split("\r\n")) {
            if (line.startsWith("dlock_" + field + ":")) {
                return Long.parseLong(line.substring(line.indexOf(':') + 1));
            }
        }
        throw new AssertionError("no dlock_" + field + " in INFO");
    }

    private static Long naiveWait(StatefulRedisConnection<String, String> connection, String token, long waitMs) {
        return connection.sync().dispatch(ACQUIRE, new IntegerOutput<>(StringCodec.UTF8),
                new CommandArgs<>(StringCodec.UTF8).addKey("r").add(token).add(30000).add("WAIT").add(waitMs));
    }

    @Test
    void lettuceSharesOneConnectionSoAWaitStallsEveryRequestAndAShortTimeoutLeavesAGrantNobodyClaims() throws Exception {
        try (Servers.Server server = Servers.start()) {
            server.command("DLOCK.ACQUIRE", "r", "someone-else", "60000");
            RedisClient client = RedisClient.create(RedisURI.create(server.url()));
            try (StatefulRedisConnection<String, String> connection = client.connect()) {
                // Lettuce's default command timeout is 60 s: a 2 s WAIT runs to its end, and a PING sent meanwhile
                // on the same (multiplexed) connection queues behind it in the server.
                assertEquals(Duration.ofSeconds(60), connection.getTimeout());
                CompletableFuture<Long> waiting = CompletableFuture.supplyAsync(() -> naiveWait(connection, "naive-1", 2000));
                Thread.sleep(200);
                long pingStarted = System.nanoTime();
                connection.sync().ping();
                long pingMs = (System.nanoTime() - pingStarted) / 1_000_000;
                assertEquals(null, waiting.get());
                System.err.printf("Lettuce defaults: a PING behind a 2 s WAIT on the shared connection took %d ms%n", pingMs);
                assertTrue(pingMs >= 1_500, "the PING did not wait for the WAIT: " + pingMs + " ms");

                // A command timeout shorter than the wait: the call gives up at 1 s, the connection stays open, and the
                // server keeps the waiter. When the holder releases, the server hands the lease to a token nobody waits for.
                connection.setTimeout(Duration.ofSeconds(1));
                long started = System.nanoTime();
                assertThrows(RedisCommandTimeoutException.class, () -> naiveWait(connection, "naive-2", 3000));
                long gaveUp = (System.nanoTime() - started) / 1_000_000;
                server.command("DLOCK.RELEASE", "r", "someone-else");
                Thread.sleep(100);
                Info info = Protocol.parseInfo(java.util.Arrays.asList(infoFields(server))).orElseThrow();
                System.err.printf("Lettuce, 1 s timeout, WAIT 3000: gave up after %d ms; the server then granted %s%n",
                        gaveUp, info.owner());
                assertTrue(gaveUp >= 900 && gaveUp < 1_500, "gave up after " + gaveUp + " ms");
                assertEquals("naive-2", info.owner(), "the lease went to the waiter that gave up");
                connection.setTimeout(Duration.ofSeconds(60));
            } finally {
                client.shutdown();
            }

            // This client: the wait on a connection of its own with a timeout above it, always with a claim window.
            server.command("DEL", "r");
            server.command("DLOCK.ACQUIRE", "r", "someone-else", "60000");
            try (Locks locks = Locks.connect(server.url())) {
                long waitsBefore = dlockStat(server, "waits_started");
                long timedOutBefore = dlockStat(server, "waits_timed_out");
                long started = System.nanoTime();
                NotAcquiredException held = assertThrows(NotAcquiredException.class,
                        () -> locks.hold("r", HoldOptions.defaults().waitFor(Duration.ofSeconds(2)).requestTimeout(Duration.ofMillis(500))));
                long took = (System.nanoTime() - started) / 1_000_000;
                System.err.printf("dlock hold, wait 2 s: %s after %d ms%n", held.outcome(), took);
                assertEquals(NotAcquiredException.Outcome.HELD, held.outcome());
                assertEquals(1, dlockStat(server, "waits_started") - waitsBefore);
                assertEquals(1, dlockStat(server, "waits_timed_out") - timedOutBefore);
                assertTrue(took >= 1_900 && took < 3_000, "took " + took);
            }
        }
    }

    /** DLOCK.INFO r as a flat RESP2 list, read with the tests' own small client. */
    private static Object[] infoFields(Servers.Server server) {
        String owner = server.command("EVAL", "local i = redis.call('DLOCK.INFO', KEYS[1]) return i[2]", "1", "r");
        return new Object[] {"owner", owner, "fence", 1L};
    }
}
