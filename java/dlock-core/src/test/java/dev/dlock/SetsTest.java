package dev.dlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.dlock.testkit.Servers;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.logging.Handler;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Sets of resources ({@link Locks#holdAll}) against a real server: granted whole or not at all,
 * waiting in every member's line, renewed, lost and released whole ({@code docs/protocol.md},
 * section 7, "Sets of resources").
 */
class SetsTest {
    private static final HoldOptions NO_WAIT = HoldOptions.defaults().ttl(Duration.ofSeconds(10)).noWait();
    private static final Logger DLOCK_LOG = Logger.getLogger("dev.dlock"); // held: JUL keeps loggers weakly

    private static Servers.Server server;
    private static Locks locks;

    @BeforeAll
    static void start() {
        server = Servers.start();
        locks = Locks.connect(server.url());
    }

    @AfterAll
    static void stop() {
        locks.close();
        server.close();
    }

    private static void eventually(String what, BooleanSupplier condition) throws InterruptedException {
        long deadline = System.nanoTime() + Duration.ofSeconds(5).toNanos();
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("not within 5 s: " + what);
            }
            Thread.sleep(5);
        }
    }

    private static boolean exists(String key) {
        return server.command("EXISTS", key).equals(":1");
    }

    private static final class Seen implements Metrics {
        final List<LossReason> lost = new CopyOnWriteArrayList<>();

        @Override
        public void leaseLost(LossReason reason) {
            lost.add(reason);
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
    void aSetIsGrantedWholeWithAFencePerMemberInTheCallersOrder() throws Exception {
        List<String> members = List.of("{whole}:b", "{whole}:a");
        Lines log = new Lines();
        DLOCK_LOG.addHandler(log);
        try (SetLease set = locks.holdAll(members, NO_WAIT)) {
            assertEquals(members, set.resources());
            List<Long> fences = set.fences();
            assertEquals(2, fences.size());
            assertTrue(Long.compareUnsigned(fences.get(1), fences.get(0)) > 0, "granted in the order given: " + fences);
            for (int i = 0; i < members.size(); i++) {
                Info info = locks.info(members.get(i)).orElseThrow();
                assertEquals(set.token(), info.owner());
                assertEquals(fences.get(i), info.fence());
                assertEquals(fences.get(i), set.fence(members.get(i)));
            }
            assertThrows(IllegalArgumentException.class, () -> set.fence("{whole}:c"));
            assertEquals("OK", set.fenced("{whole}:a", "SET", "{whole}:data", "x"));
            assertTrue(set.fenceCheck("{whole}:b"));
            set.check();
            assertTrue(set.renew());
            assertTrue(log.lines.contains("dlock: lease acquired resource={whole}:b,{whole}:a owner=" + set.token()
                    + " fence=" + Long.toUnsignedString(fences.get(0)) + "," + Long.toUnsignedString(fences.get(1))
                    + " mode=exclusive"), log.lines.toString());
        } finally {
            DLOCK_LOG.removeHandler(log);
        }
        // Released whole at the block's end.
        assertFalse(exists("{whole}:a"));
        assertFalse(exists("{whole}:b"));
        assertThrows(IllegalArgumentException.class, () -> locks.holdAll(List.of("{whole}:a", "{whole}:a"), NO_WAIT));
        assertThrows(IllegalArgumentException.class, () -> locks.holdAll(List.of(), NO_WAIT));
    }

    @Test
    void aSetWithAHeldMemberIsNotAcquiredAndTakesNothing() throws Exception {
        try (Lease held = locks.hold("{part}:2", NO_WAIT)) {
            NotAcquiredException e = assertThrows(NotAcquiredException.class,
                    () -> locks.holdAll(List.of("{part}:1", "{part}:2"), NO_WAIT));
            assertEquals(NotAcquiredException.Outcome.HELD, e.outcome());
            assertFalse(exists("{part}:1"), "nothing of the set was taken");
            assertEquals(held.token(), locks.info("{part}:2").orElseThrow().owner());

            // A wait that ends without a grant withdraws the set's tickets from every line (its
            // ticket, 1 s at the least, would otherwise keep the free member for a while).
            long started = System.nanoTime();
            e = assertThrows(NotAcquiredException.class,
                    () -> locks.holdAll(List.of("{part}:1", "{part}:2"), NO_WAIT.waitFor(Duration.ofMillis(300))));
            assertEquals(NotAcquiredException.Outcome.HELD, e.outcome());
            assertTrue(System.nanoTime() - started >= Duration.ofMillis(300).toNanos());
            assertFalse(exists("{part}:1"), "the set's ticket withdrawn");
            assertEquals(0, locks.info("{part}:2").orElseThrow().tickets());
        }
    }

    @Test
    void aWaitingSetIsGrantedWhenTheMemberFreesAndASingleRequestQueuesBehindIt() throws Exception {
        String free = "{line}:1";
        String busy = "{line}:2";
        HoldOptions wait = NO_WAIT.waitFor(Duration.ofSeconds(8));
        Lease holder = locks.hold(busy, NO_WAIT);
        CompletableFuture<SetLease> set = CompletableFuture.supplyAsync(() -> locks.holdAll(List.of(free, busy), wait));
        // The set waits in line and holds nothing: the free member stays free, kept for it.
        eventually("the set's ticket in line",
                () -> locks.info(free).map(i -> i.tickets() == 1 && i.owner() == null).orElse(false));
        CompletableFuture<Lease> single = CompletableFuture.supplyAsync(() -> locks.hold(free, wait.blocking()));
        eventually("a single waiter behind it", () -> locks.info(free).map(i -> i.waiters() == 1).orElse(false));
        assertFalse(single.isDone(), "a single request came later: it waits behind the set");
        holder.release();
        long released = System.nanoTime();
        SetLease granted = set.get(5, TimeUnit.SECONDS);
        long tookMs = (System.nanoTime() - released) / 1_000_000;
        assertTrue(tookMs < 500, "granted " + tookMs + " ms after the member's release (a message wakes it)");
        assertTrue(Long.compareUnsigned(granted.fence(busy), holder.fence()) > 0);
        assertEquals(granted.token(), locks.info(free).orElseThrow().owner());
        assertFalse(single.isDone());
        granted.close();
        try (Lease next = single.get(5, TimeUnit.SECONDS)) {
            assertTrue(Long.compareUnsigned(next.fence(), granted.fence(free)) > 0);
        }
    }

    @Test
    void aDeletedMemberLosesTheWholeSetAndTheRestIsReleased() throws Exception {
        Seen seen = new Seen();
        Lines log = new Lines();
        DLOCK_LOG.addHandler(log);
        try (Locks counted = Locks.connect(server.url()).withMetrics(seen)) {
            SetLease set = counted.holdAll(List.of("{gone}:1", "{gone}:2"), NO_WAIT.ttl(Duration.ofMillis(900)));
            CompletableFuture<LeaseLostException> lost = set.whenLost().toCompletableFuture();
            assertEquals(":1", server.command("DEL", "{gone}:2"));
            long deleted = System.nanoTime();
            LeaseLostException loss = lost.get(5, TimeUnit.SECONDS);
            long tookMs = (System.nanoTime() - deleted) / 1_000_000;
            assertEquals(LossReason.RENEWAL_REFUSED, loss.reason());
            assertTrue(tookMs < 300 + 200, "lost " + tookMs + " ms after the DEL (ttl/3 is 300 ms)");
            assertEquals(List.of("{gone}:1", "{gone}:2"), loss.resources());
            assertEquals(set.fences(), loss.fences());
            eventually("the other member released", () -> !exists("{gone}:1"));
            assertThrows(StaleFenceException.class, () -> set.fenced("{gone}:1", "SET", "{gone}:data", "x"));
            assertFalse(exists("{gone}:data"));
            LeaseLostException closing = assertThrows(LeaseLostException.class, set::close);
            assertEquals(LossReason.RENEWAL_REFUSED, closing.reason());
            assertEquals(List.of(LossReason.RENEWAL_REFUSED), seen.lost, "one set, one loss");
            String fences = Long.toUnsignedString(set.fences().get(0)) + "," + Long.toUnsignedString(set.fences().get(1));
            assertTrue(log.lines.contains("dlock: lease lost resource={gone}:1,{gone}:2 owner=" + set.token() + " fence=" + fences
                    + " reason=renewal_refused"), log.lines.toString());
        } finally {
            DLOCK_LOG.removeHandler(log);
        }
    }

    @Test
    void aRevokedMemberLosesTheSetAtOnceAndTheRestIsReleased() throws Exception {
        SetLease set = locks.holdAll(List.of("{rev}:1", "{rev}:2"), NO_WAIT.ttl(Duration.ofSeconds(30)));
        CompletableFuture<LeaseLostException> lost = set.whenLost().toCompletableFuture();
        // Listening on the member's channel before the REVOKE (one that races it is the renewal's to catch).
        // (a PUBLISH answers how many clients heard it; a lease ignores a message it does not know).
        eventually("subscribed", () -> server.command("PUBLISH", Protocol.channelName("{rev}:2"), "hello").equals(":1"));
        assertEquals(":1", server.command("DLOCK.REVOKE", "{rev}:2", "REASON", "stuck"));
        LeaseLostException loss = lost.get(2, TimeUnit.SECONDS); // long before the first renewal (10 s)
        assertEquals(LossReason.REVOKED, loss.reason());
        assertEquals("stuck", loss.detail());
        assertTrue(set.isLost());
        eventually("the other member released", () -> !exists("{rev}:1"));
        assertEquals(LossReason.REVOKED, assertThrows(LeaseLostException.class, set::close).reason());
    }

    @Test
    void aMemberEndedBeforeTheReleaseIsTheLossEndedAndRunReleasesTheSet() throws Exception {
        SetLease set = locks.holdAll(List.of("{end}:1", "{end}:2"), NO_WAIT);
        assertEquals(":1", server.command("DLOCK.RELEASE", "{end}:1", set.token()));
        LeaseLostException ended = assertThrows(LeaseLostException.class, set::release);
        assertEquals(LossReason.ENDED, ended.reason());
        assertFalse(exists("{end}:2"), "the members still held were released");

        String output = locks.runAll(List.of("{end}:1", "{end}:2"), NO_WAIT, held -> {
            held.check();
            assertEquals(held.token(), locks.info("{end}:2").orElseThrow().owner());
            return "done";
        });
        assertEquals("done", output);
        assertFalse(exists("{end}:1"));
        assertFalse(exists("{end}:2"));
        try (SetLease one = locks.holdAll(List.of("{end}:2"), NO_WAIT)) {
            assertNotEquals(0, one.fence("{end}:2"));
        }
    }

    @Test
    void aSetWhoseRenewalsGoUnansweredIsLostAtItsLocalExpiry() throws Exception {
        SetLease set = locks.holdAll(List.of("{far}:1", "{far}:2"), NO_WAIT.ttl(Duration.ofMillis(600))
                .requestTimeout(Duration.ofMillis(200)));
        server.pause(); // the process runs, the set's RENEWALLs go unanswered
        try {
            LeaseLostException loss = set.whenLost().toCompletableFuture().get(2, TimeUnit.SECONDS);
            assertEquals(LossReason.UNREACHABLE, loss.reason());
            assertTrue(System.nanoTime() - set.localExpiryNanos() >= 0, "lost before the local expiry");
            assertEquals(LossReason.UNREACHABLE, assertThrows(LeaseLostException.class, set::check).reason());
        } finally {
            server.resume();
        }
        assertEquals(LossReason.UNREACHABLE, assertThrows(LeaseLostException.class, set::close).reason());
    }
}
