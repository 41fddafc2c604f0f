package dev.dlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The client's rules written once in Protocol (docs/protocol.md, sections 2, 3, 9 and 13). */
class ProtocolRulesTest {
    @Test
    void theClaimWindowIsTwiceTheRequestTimeoutAtLeastASecondAndATicketAndNeverAboveTheTtl() {
        assertEquals(4_000, Protocol.claimWindowMs(Duration.ofSeconds(2), 0));
        assertEquals(1_000, Protocol.claimWindowMs(Duration.ofMillis(200), 0));
        assertEquals(6_000, Protocol.claimWindowMs(Duration.ofSeconds(2), 6_000));
        List<String> args = new Protocol.AcquireForm("r", "t", 500, false, 0, 5_000L, 0,
                Protocol.claimWindowMs(Duration.ofSeconds(2), 0), null).args();
        assertEquals(List.of("DLOCK.ACQUIRE", "r", "t", "500", "WAIT", "5000", "CLAIM", "500"), args);
    }

    @Test
    void aTicketStartsOnItsGrantedMessageOnlyWithARequestTimeoutOfTheWindowLeft() {
        long ms = 1_000_000;
        List<Long> sends = List.of(1_000 * ms, 3_000 * ms);
        Duration timeout = Duration.ofSeconds(2);
        Protocol.Granted second = Protocol.granted("granted 9 2 6000").orElseThrow();
        // Sent at 3 s with a 6 s window: the lease runs until 9 s at least.
        assertEquals(java.util.OptionalLong.of(9_000 * ms), Protocol.startedExpiry(second, sends, 6_999 * ms, timeout));
        // Not more than a request timeout left: the next ACQUIRE claims instead.
        assertEquals(java.util.OptionalLong.empty(), Protocol.startedExpiry(second, sends, 7_000 * ms, timeout));
        // A request the attempt did not send (0, or past its last): not started on.
        assertEquals(java.util.OptionalLong.empty(),
                Protocol.startedExpiry(Protocol.granted("granted 9 3 6000").orElseThrow(), sends, 0, timeout));
        assertEquals(java.util.OptionalLong.empty(),
                Protocol.startedExpiry(Protocol.granted("granted 9 0 6000").orElseThrow(), sends, 0, timeout));
        assertEquals(java.util.OptionalLong.empty(), Protocol.startedExpiry(
                Protocol.granted("granted 9 18446744073709551615 6000").orElseThrow(), sends, 0, timeout));
        // A window too long to add is cut, never wrapped into the past.
        long far = Protocol.startedExpiry(Protocol.granted("granted 9 1 18446744073709551615").orElseThrow(), sends,
                0, timeout).orElseThrow();
        assertTrue(far - 1_000 * ms > 0);
    }

    @Test
    void lengthsAreSentInWholeMillisecondsAndTheLocalExpiryCountsWhatWasSent() {
        assertEquals(900, Protocol.wholeMs(Duration.ofNanos(900_999_999)));
        assertEquals(1, Protocol.wholeMs(Duration.ofNanos(1)));
        long sent = 123_456_789L;
        assertEquals(sent + 900_000_000L, Protocol.localExpiry(sent, 900));
    }

    @Test
    void renewalsComeEveryThirdOfTheTtlAndAFailedOneIsRetriedEveryTenth() {
        assertEquals(300_000_000L, Protocol.renewalPeriodNanos(900));
        assertEquals(90_000_000L, Protocol.renewalRetryNanos(900));
        assertEquals(2_000, Protocol.ticketRefreshMs(6_000));
        assertEquals(1, Protocol.ticketRefreshMs(2));
    }

    @Test
    void onlyATooLongWaitTellsTheServersLongestWait() {
        assertEquals(86_400_000, Protocol.longestWaitMs("ERR timeout-ms must be an integer between 0 and 86400000"));
        assertEquals(-1, Protocol.longestWaitMs("ERR ttl-ms must be an integer between 1 and 86400000"));
        assertEquals(-1, Protocol.longestWaitMs("ERR WAIT needs a timeout-ms argument"));
        assertEquals(-1, Protocol.longestWaitMs(null));
    }

    @Test
    void claimMetaFenceAndQueueMayBeDroppedNothingElse() {
        for (String option : List.of("CLAIM", "META", "FENCE", "QUEUE")) {
            assertTrue(Protocol.droppable(option), option);
        }
        for (String option : List.of("SHARED", "LIMIT", "WAIT")) {
            assertFalse(Protocol.droppable(option), option);
        }
    }

    @Test
    void logLinesCarryTheirFieldsAsKeyValue() {
        assertEquals("dlock: renewal failed resource=r owner=t fence=7 reason=refused",
                Protocol.LogLine.RENEWAL_FAILED.format("resource", "r", "owner", "t", "fence", "7", "reason", "refused"));
        assertEquals(System.Logger.Level.INFO, Protocol.LogLine.LEASE_ACQUIRED.level);
        assertEquals("dlock: stale operation rejected", Protocol.LogLine.STALE_REJECTED.text);
    }
}
