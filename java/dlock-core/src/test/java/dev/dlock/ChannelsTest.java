package dev.dlock;

import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.dlock.testkit.Servers;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** The shared pub/sub connection of a server's channels, against a real server. */
class ChannelsTest {
    @Test
    void aSecondJoinerOfAPendingSubscriptionWaitsForItsConfirmation() throws Exception {
        try (Servers.Server server = Servers.start()) {
            RedisClient client = RedisClient.create();
            Channels channels = new Channels(client, RedisURI.create(server.url()), false, null);
            try {
                // The connection is open (a watch on another channel keeps it), then the server stops:
                // the SUBSCRIBE of the first joiner of "r" stays unconfirmed until it resumes.
                Channels.Watch kept = channels.join("warm", null, Duration.ofSeconds(5));
                server.pause();
                long resumed;
                CompletableFuture<Channels.Watch> first;
                long secondJoined;
                Channels.Watch second;
                try {
                    first = CompletableFuture.supplyAsync(() -> channels.join("r", "00000001", Duration.ofSeconds(5)));
                    Thread.sleep(200); // the first joiner sent SUBSCRIBE and waits for its confirmation
                    CompletableFuture<Long> resume = CompletableFuture.supplyAsync(() -> {
                        try {
                            Thread.sleep(800);
                        } catch (InterruptedException e) {
                            Thread.currentThread().interrupt();
                        }
                        long at = System.nanoTime();
                        server.resume();
                        return at;
                    });
                    second = channels.join("r", "00000002", Duration.ofSeconds(5));
                    secondJoined = System.nanoTime();
                    resumed = resume.get(5, TimeUnit.SECONDS);
                } finally {
                    server.resume();
                }
                // Subscribed only once the server confirmed it: a message published after the join
                // returned reaches the second joiner.
                assertTrue(secondJoined - resumed >= 0, "the second joiner returned "
                        + (resumed - secondJoined) / 1_000_000 + " ms before the server could confirm the subscription");
                while (second.await(Duration.ofMillis(50))) {
                    // the subscription's own wake-up, taken before the message
                }
                server.command("PUBLISH", Protocol.channelName("r"), "handoff 7 00000002");
                assertTrue(second.await(Duration.ofSeconds(2)), "the hand-over woke the second joiner");
                channels.leave(first.get(5, TimeUnit.SECONDS));
                channels.leave(second);
                channels.leave(kept);
            } finally {
                channels.close();
                client.shutdown();
            }
        }
    }
}
