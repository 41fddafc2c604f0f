package dev.dlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.dlock.testkit.Proxy;
import dev.dlock.testkit.Servers;
import java.time.Duration;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.parallel.Execution;
import org.junit.jupiter.api.parallel.ExecutionMode;

/** Leases against a real server with the module ($DLOCK_SERVER or redis-server), each test on its own resources. */
@Execution(ExecutionMode.SAME_THREAD)
class LeaseTest {
    private static Servers.Server server;
    private static Locks locks;
    private static final HoldOptions SHORT = HoldOptions.defaults().ttl(Duration.ofMillis(900)).noWait();

    @BeforeAll
    static void start() {
        server = Servers.start();
        locks = Locks.connect(server.url());
        // The first request connects (a cold JVM takes most of a second): a 900 ms lease granted by it
        // would count as lost at once, since its local expiry runs from before the send.
        locks.info("warm-up");
    }

    @AfterAll
    static void stop() {
        locks.close();
        server.close();
    }

    @Test
    void aHeldResourceIsNotGrantedTwiceAndAReleaseHandsItOn() {
        try (Lease first = locks.hold("held", SHORT)) {
            NotAcquiredException refused = assertThrows(NotAcquiredException.class, () -> locks.hold("held", SHORT));
            assertEquals(NotAcquiredException.Outcome.HELD, refused.outcome());
            assertEquals(first.token(), locks.info("held").orElseThrow().owner());
        }
        try (Lease second = locks.hold("held", SHORT)) {
            assertTrue(second.fence() > 0);
        }
    }

    @Test
    void aTtlIsSentAndCountedInWholeMilliseconds() {
        // 900.999999 ms goes to the server as 900: the local expiry counts the 900 the server counts,
        // never the fraction it does not know of.
        try (Lease lease = locks.hold("whole-ms", SHORT.ttl(Duration.ofNanos(900_999_999)))) {
            long returned = System.nanoTime();
            assertEquals(Duration.ofMillis(900), lease.ttl());
            assertTrue(lease.localExpiryNanos() - returned <= 900_000_000L, "the local expiry is past the server's");
            assertTrue(locks.info("whole-ms").orElseThrow().ttlMs() <= 900);
        }
    }

    @Test
    void renewalsKeepALeaseAlivePastItsTtl() throws Exception {
        try (Lease lease = locks.hold("renewed", SHORT)) {
            Thread.sleep(2_000); // more than twice the ttl
            lease.check();
            assertTrue(lease.fenceCheck());
            assertFalse(lease.isLost());
        }
    }

    @Test
    void anOperatorsDelIsALossWithinAThirdOfTheTtl() throws Exception {
        Lease lease = locks.hold("deleted", SHORT);
        long deleted = System.nanoTime();
        server.command("DEL", "deleted");
        LeaseLostException loss = lease.whenLost().toCompletableFuture().get(2, TimeUnit.SECONDS);
        long took = (System.nanoTime() - deleted) / 1_000_000;
        assertEquals(LossReason.RENEWAL_REFUSED, loss.reason());
        assertTrue(took <= 900 / 3 + 150, "lost after " + took + " ms");
        assertEquals(Optional.of(LossReason.RENEWAL_REFUSED), lease.lostReason());
        assertThrows(LeaseLostException.class, lease::check);
        assertThrows(LeaseLostException.class, lease::close);
    }

    @Test
    void theReadmesQuickStartIsQuickstartJavaAndRunsAsWritten() throws Exception {
        // The quick start is a whole program: src/test/java/Quickstart.java, printed as it is.
        String program = java.nio.file.Files.readString(java.nio.file.Path.of("src/test/java/Quickstart.java"));
        List<String> readme = java.nio.file.Files.readAllLines(java.nio.file.Path.of("../README.md"));
        int from = readme.indexOf("```java");
        int to = readme.subList(from + 1, readme.size()).indexOf("```") + from + 1;
        assertEquals(program, String.join("\n", readme.subList(from + 1, to)) + "\n", "README.md's first Java block is Quickstart.java");
        // Run in a JVM of its own, as a program, against the server given as REDIS_URL.
        ProcessBuilder builder = new ProcessBuilder(
                java.nio.file.Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                "-cp", System.getProperty("java.class.path"), "Quickstart");
        builder.environment().put("REDIS_URL", server.url());
        builder.redirectError(ProcessBuilder.Redirect.INHERIT); // its log lines
        Process process = builder.start();
        String output = new String(process.getInputStream().readAllBytes(), java.nio.charset.StandardCharsets.UTF_8);
        assertTrue(process.waitFor(30, TimeUnit.SECONDS), "the quick start ended");
        assertEquals(0, process.exitValue(), output);
        assertTrue(output.matches("paid under fence \\d+\n"), output);
        assertTrue(locks.info("invoice:42").isEmpty(), "released");
    }

    @Test
    void theReadmesTryWithResourcesReportsALossOnce() {
        // The README's example, with the lease lost inside the block: check() and close() both
        // report the loss, and Java adds close()'s to check()'s as suppressed.
        LeaseLostException thrown = assertThrows(LeaseLostException.class, () -> {
            try (Lease lease = locks.hold("readme", SHORT)) {
                server.command("DEL", "readme");
                lease.whenLost().toCompletableFuture().get(2, TimeUnit.SECONDS);
                lease.check();
            }
        });
        assertEquals(LossReason.RENEWAL_REFUSED, thrown.reason());
        assertEquals(1, thrown.getSuppressed().length);
        assertTrue(thrown.getSuppressed()[0] instanceof LeaseLostException);
        assertTrue(thrown.getCause() instanceof LeaseLostException, "the loss as first recorded is the cause");
    }

    @Test
    void closingTheLocksLosesAndReleasesItsLeases() throws Exception {
        Locks own = Locks.connect(server.url());
        Lease kept = own.hold("closed-held", SHORT);
        CompletableFuture<Object> ran = new CompletableFuture<>();
        java.util.concurrent.CountDownLatch working = new java.util.concurrent.CountDownLatch(1);
        Thread worker = new Thread(() -> {
            try {
                own.run("closed-run", SHORT, lease -> {
                    working.countDown();
                    Thread.sleep(10_000);
                    return "not protected";
                });
                ran.complete("returned");
            } catch (Throwable e) {
                ran.complete(e);
            }
        });
        worker.start();
        assertTrue(working.await(5, TimeUnit.SECONDS));
        own.close();
        assertEquals(LossReason.UNREACHABLE, kept.whenLost().toCompletableFuture().get(1, TimeUnit.SECONDS).reason());
        Object outcome = ran.get(2, TimeUnit.SECONDS);
        assertTrue(outcome instanceof LeaseLostException, "run ended with " + outcome);
        assertTrue(locks.info("closed-held").isEmpty(), "released");
        assertTrue(locks.info("closed-run").isEmpty(), "released");
    }

    @Test
    void lossCallbacksRunOnTheLocksThreadsNotLettuces() throws Exception {
        Lease lease = locks.hold("callback", SHORT);
        CompletableFuture<String> thread = new CompletableFuture<>();
        lease.whenLost().thenAccept(loss -> thread.complete(Thread.currentThread().getName()));
        server.command("DEL", "callback");
        String name = thread.get(2, TimeUnit.SECONDS);
        assertTrue(name.startsWith("dlock-callbacks"), "ran on " + name);
    }

    @Test
    void aWaiterGetsTheLeaseWhenItsHolderReleasesAndClaimsIt() throws Exception {
        Lease holder = locks.hold("queued", SHORT);
        CompletableFuture<Lease> waiter = locks.holdAsync("queued", SHORT.waitFor(Duration.ofSeconds(5)));
        Thread.sleep(200);
        assertFalse(waiter.isDone());
        long claimed = serverCount("grants_claimed");
        holder.close();
        try (Lease next = waiter.get(3, TimeUnit.SECONDS)) {
            assertTrue(next.fence() > holder.fence());
            assertEquals(claimed + 1, serverCount("grants_claimed"), "the grant was claimed");
            Thread.sleep(1_000); // claimed: the full ttl started, and renewals run
            next.check();
        }
    }

    @Test
    void ticketsWaitOnTheChannelAndAreHandedOver() throws Exception {
        HoldOptions tickets = SHORT.waitFor(Duration.ofSeconds(5)).tickets(Duration.ofSeconds(6));
        Lease holder = locks.hold("ticketed", SHORT);
        CompletableFuture<Lease> waiter = locks.holdAsync("ticketed", tickets);
        waitFor(() -> locks.info("ticketed").orElseThrow().tickets() == 1);
        long released = System.nanoTime();
        holder.close();
        try (Lease next = waiter.get(3, TimeUnit.SECONDS)) {
            long took = (System.nanoTime() - released) / 1_000_000;
            assertTrue(took < 1_000, "handed over after " + took + " ms (a ticket refresh is 2 s)");
            assertTrue(next.fence() > holder.fence());
        }
    }

    @Test
    void anInterruptedTicketWaiterTakesItsTicketOutOfLine() throws Exception {
        HoldOptions tickets = SHORT.waitFor(Duration.ofSeconds(10)).tickets(Duration.ofSeconds(6));
        try (Lease holder = locks.hold("ticket-cancelled", SHORT)) {
            CompletableFuture<Lease> waiter = locks.holdAsync("ticket-cancelled", tickets);
            waitFor(() -> locks.info("ticket-cancelled").orElseThrow().tickets() == 1);
            Thread.sleep(100); // the waiter now waits on the channel, its ticket answered
            waiter.cancel(true);
            // Released at once, not left in line for the ticket's 6 s.
            waitFor(() -> locks.info("ticket-cancelled").orElseThrow().tickets() == 0, Duration.ofSeconds(2));
            assertEquals(holder.token(), locks.info("ticket-cancelled").orElseThrow().owner());
        }
    }

    @Test
    void anInterruptAfterAnUnansweredRequestIsUnknownNotHeld() throws Exception {
        try (Servers.Server own = Servers.start(); Locks paused = Locks.connect(own.url())) {
            HoldOptions options = HoldOptions.defaults().ttl(Duration.ofSeconds(30)).requestTimeout(Duration.ofMillis(200));
            Lease holder = paused.hold("unknown", options.noWait());
            CompletableFuture<NotAcquiredException> outcome = new CompletableFuture<>();
            Thread waiter = new Thread(() -> {
                try {
                    paused.hold("unknown", options.waitFor(Duration.ofSeconds(20)).tickets(Duration.ofMillis(600)));
                    outcome.completeExceptionally(new AssertionError("granted"));
                } catch (NotAcquiredException e) {
                    outcome.complete(e);
                } catch (Throwable e) {
                    outcome.completeExceptionally(e);
                }
            });
            waiter.start();
            waitFor(() -> paused.info("unknown").orElseThrow().tickets() == 1);
            own.pause();
            try {
                Thread.sleep(700); // a ticket refresh (every 200 ms) went unanswered: the outcome is unknown
                waiter.interrupt();
                Thread.sleep(100);
            } finally {
                own.resume();
            }
            NotAcquiredException e = outcome.get(10, TimeUnit.SECONDS);
            assertEquals(NotAcquiredException.Outcome.UNKNOWN, e.outcome());
            waitFor(() -> paused.info("unknown").orElseThrow().tickets() == 0, Duration.ofSeconds(2));
            holder.close();
        }
    }

    @Test
    void aCancelledHoldAsyncLeavesNoLeaseBehind() throws Exception {
        // Cancelled at every moment of the attempt, the grant's moment included: whatever was
        // granted is released (never a lease nobody holds, renewed for ever).
        int rounds = 60;
        List<CompletableFuture<Lease>> kept = new java.util.ArrayList<>();
        for (int i = 0; i < rounds; i++) {
            CompletableFuture<Lease> future = locks.holdAsync("cancelled-" + i, SHORT);
            long until = System.nanoTime() + (i % 20) * 150_000L; // 0 to 3 ms
            while (System.nanoTime() < until) {
                Thread.onSpinWait();
            }
            if (!future.cancel(true)) {
                kept.add(future);
            }
        }
        for (CompletableFuture<Lease> future : kept) {
            try {
                future.join().close();
            } catch (java.util.concurrent.CompletionException e) {
                // not granted
            }
        }
        Thread.sleep(1_500); // beyond the ttl: only a lease still renewed would remain
        for (int i = 0; i < rounds; i++) {
            assertTrue(locks.info("cancelled-" + i).isEmpty(), "cancelled-" + i + " is still held");
        }
    }

    @Test
    void aWaitThatEndsUnansweredLeavesNothingHeld() {
        try (Lease holder = locks.hold("timed", SHORT)) {
            long started = System.nanoTime();
            NotAcquiredException held = assertThrows(NotAcquiredException.class,
                    () -> locks.hold("timed", SHORT.waitFor(Duration.ofMillis(500))));
            long took = (System.nanoTime() - started) / 1_000_000;
            assertEquals(NotAcquiredException.Outcome.HELD, held.outcome());
            assertTrue(took >= 450 && took < 2_000, "took " + took);
            Info info = locks.info("timed").orElseThrow();
            assertEquals(holder.token(), info.owner());
            assertEquals(0, info.waiters());
        }
    }

    @Test
    void runKeepsTheWorksExceptionAndNeverHidesALoss() throws Exception {
        IllegalStateException own = new IllegalStateException("the work failed");
        IllegalStateException thrown = assertThrows(IllegalStateException.class,
                () -> locks.run("run", SHORT, () -> { throw own; }));
        assertSame(own, thrown);
        assertEquals("done", locks.run("run", SHORT, lease -> "done"));
        // A loss while the work runs: the work is interrupted and the loss is what the caller sees.
        LeaseLostException lost = assertThrows(LeaseLostException.class, () -> locks.run("run", SHORT, lease -> {
            server.command("DEL", "run");
            Thread.sleep(5_000);
            return "not protected";
        }));
        assertEquals(LossReason.RENEWAL_REFUSED, lost.reason());
        // The work's own failure after a loss stays the one thrown, the loss beside it.
        IllegalStateException failed = assertThrows(IllegalStateException.class, () -> locks.run("run", SHORT, lease -> {
            server.command("DEL", "run");
            while (!lease.isLost()) {
                Thread.onSpinWait(); // work that does not block (the interrupt interrupts nothing)
            }
            throw own;
        }));
        assertSame(own, failed);
        assertTrue(failed.getSuppressed()[0] instanceof LeaseLostException);
    }

    @Test
    void fencedWritesRunUnderTheLiveFenceOnly() {
        Lease first = locks.hold("invoice:{1}", SHORT);
        assertEquals("OK", first.fenced("SET", "invoice:{1}:status", "draft"));
        server.command("DEL", "invoice:{1}");
        try (Lease second = locks.hold("invoice:{1}", SHORT)) {
            assertThrows(StaleFenceException.class, () -> first.fenced("SET", "invoice:{1}:status", "paid"));
            assertEquals("draft", server.command("GET", "invoice:{1}:status"));
            assertEquals(1L, second.fenced("DEL", "invoice:{1}:status"));
        }
        assertThrows(LeaseLostException.class, first::close);
    }

    @Test
    void aFencedWriteWhoseReplyIsLostIsNeverSentAgain() throws Exception {
        try (Proxy proxy = new Proxy(server.port); Locks through = Locks.connect(proxy.url())) {
            try (Lease lease = through.hold("invoice:{2}", HoldOptions.defaults().noWait())) {
                lease.fenced("GET", "invoice:{2}:count"); // the connections are open
                // The lease's channel is subscribed (through the proxy too): the reply dropped next is
                // the INCR's, not the SUBSCRIBE's.
                io.lettuce.core.RedisClient direct = io.lettuce.core.RedisClient.create(server.url());
                try (var node = direct.connect()) {
                    RevokeTest.awaitSubscribers(node, Protocol.channelName("invoice:{2}"), false, 1);
                } finally {
                    direct.shutdown();
                }
                proxy.dropNextReply();
                // The INCR runs, its reply is lost and the connection closed: a client that sends it
                // again on the next connection counts twice.
                assertThrows(DlockException.class, () -> lease.fenced("INCR", "invoice:{2}:count"));
                Thread.sleep(500); // time for a reconnection to replay it
                assertEquals("1", server.command("GET", "invoice:{2}:count"));
            }
        }
    }

    @Test
    void readersShareWritersDoNot() {
        HoldOptions options = SHORT;
        try (Lease a = locks.read("rw", options); Lease b = locks.read("rw", options)) {
            assertNotEquals(a.fence(), b.fence());
            assertEquals(2, locks.info("rw").orElseThrow().holders());
            assertThrows(NotAcquiredException.class, () -> locks.write("rw", options));
        }
        try (Lease writer = locks.write("rw", options)) {
            assertThrows(NotAcquiredException.class, () -> locks.read("rw", options));
        }
    }

    @Test
    void aSemaphoreGrantsItsPermitsAndNoMore() {
        try (Lease a = locks.semaphore("pool", 2, SHORT); Lease b = locks.semaphore("pool", 2, SHORT)) {
            assertThrows(NotAcquiredException.class, () -> locks.semaphore("pool", 2, SHORT));
        }
        assertThrows(IllegalArgumentException.class, () -> locks.semaphore("pool", 0, SHORT));
    }

    @Test
    void releaseAfterKeepsTheResourceHeldThatLongAndNoLonger() throws Exception {
        Lease lease = locks.hold("kept", SHORT.ttl(Duration.ofSeconds(10)));
        lease.releaseAfter(Duration.ofMillis(300));
        long ttl = locks.info("kept").orElseThrow().ttlMs();
        assertTrue(ttl > 0 && ttl <= 300, "a RENEW shortened the lease to " + ttl + " ms");
        assertEquals(NotAcquiredException.Outcome.HELD,
                assertThrows(NotAcquiredException.class, () -> locks.hold("kept", SHORT)).outcome());
        lease.release(); // does nothing: the lease ends with its ttl
        assertEquals(lease.token(), locks.info("kept").orElseThrow().owner());
        Thread.sleep(350);
        assertFalse(lease.isLost(), "a lease let expire is not lost");
        try (Lease next = locks.hold("kept", SHORT)) {
            assertTrue(next.fence() > lease.fence());
        }
        Lease gone = locks.hold("kept-gone", SHORT.ttl(Duration.ofSeconds(10))); // no renewal meanwhile
        server.command("DEL", "kept-gone");
        assertEquals(LossReason.ENDED,
                assertThrows(LeaseLostException.class, () -> gone.releaseAfter(Duration.ofMillis(300))).reason());
        Lease now = locks.hold("kept-now", SHORT);
        now.releaseAfter(Duration.ZERO); // under 1 ms: a release
        assertTrue(locks.info("kept-now").isEmpty());
    }

    @Test
    void maxHoldEndsTheLeaseAndMetaShowsTheHolder() throws Exception {
        Lease lease = locks.hold("bounded", SHORT.maxHold(Duration.ofMillis(1_200)).meta("host=a pid=7"));
        assertEquals("host=a pid=7", locks.info("bounded").orElseThrow().meta());
        LeaseLostException loss = lease.whenLost().toCompletableFuture().get(3, TimeUnit.SECONDS);
        assertEquals(LossReason.MAX_HOLD, loss.reason());
        Thread.sleep(100);
        assertTrue(locks.info("bounded").isEmpty(), "the server's lease ends with the max hold");
    }

    @Test
    void anElectionIsObservedAndPassesOnWhenItsLeaderResigns() throws Exception {
        List<Optional<Leader>> seen = new CopyOnWriteArrayList<>();
        try (AutoCloseable observer = locks.observe("election", seen::add)) {
            Lease first = locks.campaign("election", "10.0.0.1:80", SHORT.waitFor(Duration.ofSeconds(1)));
            CompletableFuture<Lease> second = CompletableFuture.supplyAsync(
                    () -> locks.campaign("election", "10.0.0.2:80", SHORT.waitFor(Duration.ofSeconds(5))));
            waitFor(() -> seen.stream().anyMatch(l -> l.isPresent() && l.get().address().equals("10.0.0.1:80")));
            first.close();
            try (Lease next = second.get(5, TimeUnit.SECONDS)) {
                waitFor(() -> seen.stream().anyMatch(l -> l.isPresent() && l.get().address().equals("10.0.0.2:80")));
                assertTrue(next.fence() > first.fence());
            }
        }
        assertTrue(seen.stream().noneMatch(l -> l.isPresent() && l.get().address() == null));
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

    private static void waitFor(java.util.function.BooleanSupplier condition) throws InterruptedException {
        waitFor(condition, Duration.ofSeconds(5));
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
