package dev.dlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.dlock.testkit.Servers;
import java.io.IOException;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import org.junit.jupiter.api.Test;

/** Every rule of Protocol against the shared vectors in protocol/vectors (the same files every client loads). */
class ProtocolVectorsTest {
    private static final ObjectMapper JSON = new ObjectMapper();

    private static JsonNode vectors(String name) throws IOException {
        return JSON.readTree(Servers.repoRoot().resolve("protocol/vectors/" + name + ".json").toFile());
    }

    @Test
    void channelNames() throws IOException {
        int n = 0;
        for (JsonNode v : vectors("channels")) {
            assertEquals(v.get("channel").asText(), Protocol.channelName(v.get("resource").asText()), v.toString());
            n++;
        }
        assertTrue(n > 5);
    }

    @Test
    void handOverTags() throws IOException {
        for (JsonNode v : vectors("tags")) {
            assertEquals(v.get("tag").asText(), Protocol.tokenTag(v.get("token").asText()), v.toString());
        }
    }

    @Test
    void messagesNameTheNewHolderByItsTagAndWakeOnlyWhomTheyConcern() throws IOException {
        JsonNode messages = vectors("messages");
        for (JsonNode v : messages.get("published")) {
            String message = v.get("message").asText();
            String[] words = message.split(" ");
            assertEquals(v.get("event").asText(), words[0]);
            assertEquals(v.get("fence").bigIntegerValue(), new BigInteger(Long.toUnsignedString(Long.parseUnsignedLong(words[1]))));
            if (v.has("holder")) {
                assertEquals(Protocol.tokenTag(v.get("holder").asText()), words[2]);
                assertTrue(Protocol.wakes(message, Protocol.tokenTag(v.get("holder").asText())));
            }
        }
        for (JsonNode v : messages.get("wakes")) {
            String tag = v.get("tag").isNull() ? null : v.get("tag").asText();
            assertEquals(v.get("wakes").asBoolean(), Protocol.wakes(v.get("message").asText(), tag), v.toString());
        }
    }

    @Test
    void revokedMessagesGiveTheirFenceAndReason() throws IOException {
        int n = 0;
        for (JsonNode v : vectors("messages").get("revoked")) {
            Optional<Protocol.Revocation> revocation = Protocol.revocation(v.get("message").asText());
            if (v.get("fence").isNull()) {
                assertFalse(revocation.isPresent(), v.toString());
            } else {
                Protocol.Revocation read = revocation.orElseThrow(() -> new AssertionError("not read: " + v));
                assertEquals(v.get("fence").bigIntegerValue(), new BigInteger(Long.toUnsignedString(read.fence())), v.toString());
                assertEquals(v.get("reason").asText(), read.reason(), v.toString());
            }
            n++;
        }
        assertTrue(n > 5);
    }

    @Test
    void keySlots() throws IOException {
        for (JsonNode v : vectors("slots")) {
            assertEquals(v.get("slot").asInt(), Protocol.keySlot(v.get("key").asText()), v.toString());
        }
    }

    /** An {@code acquire} form of commands.json (and notify.json: with {@code notify}). */
    private static Protocol.AcquireForm acquireForm(JsonNode v) {
        String mode = v.path("mode").asText("exclusive");
        return new Protocol.AcquireForm(v.get("resource").asText(), v.get("token").asText(), v.get("ttl_ms").asLong(),
                !mode.equals("exclusive"), v.path("permits").asInt(0), v.has("wait_ms") ? v.get("wait_ms").asLong() : null,
                v.path("queue_ms").asLong(0), v.path("claim_ms").asLong(0), v.path("meta").asText(null),
                v.has("notify") ? v.get("notify").asLong() : null);
    }

    @Test
    void everyCommandForm() throws IOException {
        for (JsonNode v : vectors("commands")) {
            String form = v.get("form").asText();
            String resource = v.get("resource").asText();
            String token = v.path("token").asText(null);
            long fence = v.has("fence") ? Long.parseUnsignedLong(v.get("fence").asText()) : 0;
            List<String> args;
            switch (form) {
                case "acquire":
                    args = acquireForm(v).args();
                    break;
                case "renew":
                    args = Protocol.renewArgs(resource, token, v.get("ttl_ms").asLong(), fence);
                    break;
                case "release":
                    args = Protocol.releaseArgs(resource, token, fence);
                    break;
                case "fencecheck":
                    args = Protocol.fenceCheckArgs(resource, fence);
                    break;
                case "info":
                    args = Protocol.infoArgs(resource);
                    break;
                case "fenced":
                    List<String> inner = new ArrayList<>();
                    v.get("inner").forEach(a -> inner.add(a.asText()));
                    args = Protocol.fencedArgs(resource, fence, inner);
                    break;
                default:
                    throw new AssertionError("unknown form " + form);
            }
            List<String> expected = new ArrayList<>();
            v.get("args").forEach(a -> expected.add(a.asText()));
            assertEquals(expected, args, v.get("name").asText());
        }
    }

    /** A reply as ReplyOutput decodes it: the vectors' encoding turned into Java values. */
    private static Object decode(JsonNode node) {
        if (node.isNull()) {
            return null;
        }
        if (node.isIntegralNumber()) {
            return node.canConvertToLong() ? (Object) node.asLong() : node.bigIntegerValue();
        }
        if (node.isTextual()) {
            return node.asText();
        }
        if (node.isArray()) {
            List<Object> list = new ArrayList<>();
            node.forEach(item -> list.add(decode(item)));
            return list;
        }
        if (node.has("simple")) {
            return node.get("simple").asText();
        }
        if (node.has("map")) {
            Map<Object, Object> map = new LinkedHashMap<>();
            node.get("map").forEach(pair -> map.put(decode(pair.get(0)), decode(pair.get(1))));
            return map;
        }
        throw new AssertionError("no decoding for " + node);
    }

    @Test
    void infoRepliesInResp2AndResp3() throws IOException {
        for (JsonNode v : vectors("replies").get("info")) {
            Optional<Info> info = Protocol.parseInfo(decode(v.get("reply")));
            JsonNode want = v.get("info");
            if (want.isNull()) {
                assertTrue(info.isEmpty(), v.get("name").asText());
                continue;
            }
            Info got = info.orElseThrow();
            String name = v.get("name").asText() + " (RESP" + v.get("resp").asInt() + ")";
            assertEquals(want.get("owner").asText(null), got.owner(), name);
            assertEquals(want.get("fence").isNull() ? null : Long.parseUnsignedLong(want.get("fence").asText()), got.fence(), name);
            assertEquals(want.get("ttl_ms").asLong(), got.ttlMs(), name);
            assertEquals(want.get("waiters").asLong(), got.waiters(), name);
            assertEquals(want.get("tickets").asLong(), got.tickets(), name);
            assertEquals(want.get("mode").asText(null), got.mode(), name);
            assertEquals(want.get("holders").asLong(), got.holders(), name);
            assertEquals(want.get("meta").asText(null), got.meta(), name);
            List<String> next = new ArrayList<>();
            want.get("next_waiters").forEach(t -> next.add(t.asText()));
            assertEquals(next, got.nextWaiters(), name);
            assertEquals(want.get("leases").size(), got.leases().size(), name);
            for (int i = 0; i < got.leases().size(); i++) {
                JsonNode lease = want.get("leases").get(i);
                Info.Holder holder = got.leases().get(i);
                assertEquals(lease.get("token").asText(), holder.token(), name);
                assertEquals(Long.parseUnsignedLong(lease.get("fence").asText()), holder.fence(), name);
            }
            JsonNode leader = v.get("leader");
            Optional<Leader> shown = Protocol.leaderFromInfo(decode(v.get("reply")));
            if (leader == null || leader.isNull()) {
                assertTrue(shown.isEmpty(), name);
            } else {
                assertEquals(new Leader(leader.get("token").asText(), Long.parseUnsignedLong(leader.get("fence").asText()),
                        leader.get("address").asText(null)), shown.orElseThrow(), name);
            }
        }
    }

    @Test
    void fencedRepliesAndErrorClasses() throws IOException {
        for (JsonNode v : vectors("replies").get("fenced")) {
            JsonNode reply = v.get("reply");
            if (v.get("class").isNull()) {
                assertFalse(reply.isObject() && reply.has("error"), v.get("name").asText());
            } else {
                assertEquals(v.get("class").asText(), Protocol.errorClass(reply.get("error").asText()).wireName(), v.get("name").asText());
            }
        }
        assertTrue(checkErrors(vectors("errors")) > 10);
    }

    /** Each error vector's class, the option it says an older server refused, and its bound; how many. */
    private static int checkErrors(JsonNode errors) {
        int n = 0;
        for (JsonNode v : errors) {
            String reply = v.get("reply").asText();
            assertEquals(v.get("class").asText(), Protocol.errorClass(reply).wireName(), reply);
            if (v.has("option")) {
                assertEquals(Optional.of(v.get("option").asText()), Protocol.unsupportedOption(reply), reply);
            } else {
                assertEquals(Optional.empty(), Protocol.unsupportedOption(reply), reply);
            }
            if (v.has("bound")) {
                assertEquals(v.get("bound").asLong(), Protocol.upperBound(reply), reply);
            }
            n++;
        }
        return n;
    }

    /**
     * notify.json, every section: a ticket's own channel (its wide tag and name), the
     * {@code granted} message on it, {@code NOTIFY} in the ACQUIRE, the errors about it, and the
     * local expiry a {@code granted} message gives.
     */
    @Test
    void ticketsToldOnTheirOwnChannel() throws IOException {
        JsonNode notify = vectors("notify");
        List<String> sections = new ArrayList<>();
        notify.fieldNames().forEachRemaining(sections::add);
        assertEquals(List.of("tags", "channels", "granted", "commands", "errors", "expiry"), sections, "every section read");
        for (JsonNode v : notify.get("tags")) {
            assertEquals(v.get("wide_tag").asText(), Protocol.wideTag(v.get("token").asText()), v.toString());
        }
        for (JsonNode v : notify.get("channels")) {
            assertEquals(v.get("channel").asText(),
                    Protocol.ticketChannelName(v.get("resource").asText(), v.get("token").asText()), v.toString());
        }
        for (JsonNode v : notify.get("granted")) {
            Optional<Protocol.Granted> read = Protocol.granted(v.get("message").asText());
            if (v.get("fence").isNull()) {
                assertFalse(read.isPresent(), v.toString());
                continue;
            }
            Protocol.Granted granted = read.orElseThrow(() -> new AssertionError("not read: " + v));
            assertEquals(v.get("fence").bigIntegerValue(), new BigInteger(Long.toUnsignedString(granted.fence())), v.toString());
            assertEquals(v.get("request").bigIntegerValue(), new BigInteger(Long.toUnsignedString(granted.request())), v.toString());
            assertEquals(v.get("window_ms").bigIntegerValue(), new BigInteger(Long.toUnsignedString(granted.windowMs())),
                    v.toString());
        }
        for (JsonNode v : notify.get("commands")) {
            assertEquals("acquire", v.get("form").asText(), v.get("name").asText());
            List<String> expected = new ArrayList<>();
            v.get("args").forEach(a -> expected.add(a.asText()));
            assertEquals(expected, acquireForm(v).args(), v.get("name").asText());
        }
        assertEquals(notify.get("errors").size(), checkErrors(notify.get("errors")));
        for (JsonNode v : notify.get("expiry")) {
            Protocol.Granted granted = Protocol.granted(v.get("message").asText())
                    .orElseThrow(() -> new AssertionError("not a granted message: " + v));
            List<Long> sentAt = new ArrayList<>();
            for (int request = 1; v.get("sent_ms").has(Integer.toString(request)); request++) {
                sentAt.add(v.get("sent_ms").get(Integer.toString(request)).asLong());
            }
            assertEquals(v.get("sent_ms").size(), sentAt.size(), "requests numbered from 1: " + v);
            java.util.OptionalLong expiry = Protocol.grantedExpiry(granted, sentAt, 1);
            if (v.get("expiry_ms").isNull()) {
                assertTrue(expiry.isEmpty(), v.toString());
            } else {
                assertEquals(java.util.OptionalLong.of(v.get("expiry_ms").asLong()), expiry, v.toString());
            }
        }
    }
}
