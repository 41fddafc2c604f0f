package dev.dlock.conformance;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.dlock.Locks;
import dev.dlock.testkit.Servers;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PipedInputStream;
import java.io.PipedOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** A session as the harness runs one, against a real server: requests in, one reply per id, events unprompted. */
class DriverTest {
    private static final ObjectMapper JSON = new ObjectMapper();

    @Test
    void theDriverAnswersEveryRequestAndReportsALoss() throws Exception {
        try (Servers.Server server = Servers.start(); Locks locks = Locks.connect(server.url())) {
            PipedOutputStream toDriver = new PipedOutputStream();
            PipedInputStream in = new PipedInputStream(toDriver, 1 << 16);
            PipedInputStream fromDriver = new PipedInputStream(1 << 16);
            OutputStream out = new PipedOutputStream(fromDriver);
            CompletableFuture<Integer> status = CompletableFuture.supplyAsync(() -> new Driver(locks, out).serve(in));
            BlockingQueue<JsonNode> lines = new LinkedBlockingQueue<>();
            Thread reader = new Thread(() -> {
                try (BufferedReader text = new BufferedReader(new InputStreamReader(fromDriver, StandardCharsets.UTF_8))) {
                    String line;
                    while ((line = text.readLine()) != null) {
                        lines.add(JSON.readTree(line)); // not JSON fails the read, and the test with it
                    }
                } catch (Exception e) {
                    // the driver's side closed
                }
            });
            reader.setDaemon(true);
            reader.start();
            Session session = new Session(toDriver, lines);

            JsonNode ready = session.next();
            assertEquals("ready", ready.path("event").asText(), ready.toString());
            assertTrue(ready.path("client").asText().startsWith("dlock (Java) "), ready.toString());

            JsonNode granted = session.send("{\"id\":1,\"op\":\"hold\",\"lease\":\"a\",\"resource\":\"r\",\"ttl_ms\":900}");
            assertEquals(1, granted.path("id").asInt());
            assertTrue(granted.path("ok").path("fence").asLong() > 0, granted.toString());
            assertEquals(granted.path("ok").path("token").asText(), server.command("EVAL",
                    "return redis.call('DLOCK.INFO', KEYS[1])[2]", "1", "r"));

            JsonNode held = session.send("{\"id\":2,\"op\":\"hold\",\"lease\":\"b\",\"resource\":\"r\",\"ttl_ms\":900,\"wait_ms\":100}");
            assertEquals("held", held.path("error").path("kind").asText(), held.toString());

            JsonNode work = session.send("{\"id\":3,\"op\":\"run\",\"lease\":\"a\",\"work_ms\":50,\"fail\":true}");
            assertEquals("work", work.path("error").path("kind").asText(), work.toString());
            assertEquals(":0", server.command("EXISTS", "r"), "the run released the lease");
            JsonNode again = session.send("{\"id\":4,\"op\":\"release\",\"lease\":\"a\"}");
            assertEquals(false, again.path("ok").path("released").asBoolean(true), "a hold that ended: " + again);

            JsonNode c = session.send("{\"id\":5,\"op\":\"hold\",\"lease\":\"c\",\"resource\":\"r\",\"ttl_ms\":900}");
            assertNotNull(c.path("ok").get("fence"), c.toString());
            server.command("DEL", "r"); // an operator's DEL: lost within ttl/3
            JsonNode lost = session.next();
            assertEquals("lost", lost.path("event").asText(), lost.toString());
            assertEquals("c", lost.path("lease").asText());
            assertEquals("renewal_refused", lost.path("reason").asText());

            JsonNode stale = session.send("{\"id\":6,\"op\":\"fenced\",\"lease\":\"c\",\"command\":[\"SET\",\"r:data\",\"x\"]}");
            assertEquals(6, stale.path("id").asInt());
            assertEquals("stale", stale.path("error").path("kind").asText(), stale.toString());
            assertEquals("$-1", server.command("GET", "r:data"));

            JsonNode bad = session.send("{\"id\":7,\"op\":\"semaphore\",\"lease\":\"s\",\"resource\":\"p\",\"permits\":0,\"ttl_ms\":900}");
            assertEquals("usage", bad.path("error").path("kind").asText(), bad.toString());
            JsonNode unknown = session.send("{\"id\":8,\"op\":\"release\",\"lease\":\"never\"}");
            assertEquals("usage", unknown.path("error").path("kind").asText(), unknown.toString());

            JsonNode d = session.send("{\"id\":9,\"op\":\"hold\",\"lease\":\"d\",\"resource\":\"q\",\"ttl_ms\":5000}");
            JsonNode write = session.send("{\"id\":10,\"op\":\"fenced\",\"lease\":\"d\",\"command\":[\"RPUSH\",\"q:list\",\"x\",\"y\"]}");
            assertEquals(2, write.path("ok").path("reply").asInt(), write.toString());
            JsonNode read = session.send("{\"id\":11,\"op\":\"fenced\",\"lease\":\"d\",\"command\":[\"LRANGE\",\"q:list\",\"0\",\"-1\"]}");
            assertEquals("[\"x\",\"y\"]", read.path("ok").path("reply").toString(), read.toString());

            // A set: its fences in the order asked, a fenced write under a member's fence, released whole.
            JsonNode set = session.send("{\"id\":12,\"op\":\"hold_all\",\"lease\":\"s\",\"resources\":[\"{s}:2\",\"{s}:1\"],"
                    + "\"ttl_ms\":5000}");
            JsonNode fences = set.path("ok").path("fences");
            assertEquals(2, fences.size(), set.toString());
            assertTrue(fences.get(1).asLong() > fences.get(0).asLong(), set.toString());
            assertEquals(set.path("ok").path("token").asText(), server.command("EVAL",
                    "return redis.call('DLOCK.INFO', KEYS[1])[2]", "1", "{s}:1"));
            JsonNode member = session.send("{\"id\":13,\"op\":\"fenced\",\"lease\":\"s\",\"resource\":\"{s}:1\","
                    + "\"command\":[\"SET\",\"{s}:data\",\"x\"]}");
            assertEquals("OK", member.path("ok").path("reply").asText(), member.toString());
            JsonNode which = session.send("{\"id\":14,\"op\":\"fenced\",\"lease\":\"s\",\"command\":[\"GET\",\"{s}:data\"]}");
            assertEquals("usage", which.path("error").path("kind").asText(), which.toString());
            JsonNode releasedSet = session.send("{\"id\":15,\"op\":\"release\",\"lease\":\"s\"}");
            assertTrue(releasedSet.path("ok").path("released").asBoolean(false), releasedSet.toString());
            assertEquals(":0", server.command("EXISTS", "{s}:1", "{s}:2"));

            toDriver.close();
            assertEquals(0, status.get(5, TimeUnit.SECONDS));
            // stdin closed: nothing was released on purpose.
            assertEquals(d.path("ok").path("token").asText(), server.command("EVAL",
                    "return redis.call('DLOCK.INFO', KEYS[1])[2]", "1", "q"));
        }
    }

    private record Session(OutputStream toDriver, BlockingQueue<JsonNode> lines) {
        JsonNode next() throws InterruptedException {
            JsonNode line = lines.poll(5, TimeUnit.SECONDS);
            assertNotNull(line, "no line from the driver");
            return line;
        }

        JsonNode send(String request) throws Exception {
            toDriver.write((request + "\n").getBytes(StandardCharsets.UTF_8));
            toDriver.flush();
            return next();
        }
    }
}
