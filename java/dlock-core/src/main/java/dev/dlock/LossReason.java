package dev.dlock;

import java.util.Locale;

/** Why a lease was lost ({@code docs/protocol.md}, section 4): the same names in every language. */
public enum LossReason {
    /** A RENEW answered 0: expired, deleted, revoked or taken over on the server. */
    RENEWAL_REFUSED,
    /**
     * No renewal answered before the conservative local expiry: the last renewal sent got no
     * answer (it failed, timed out, or was still outstanding). Also every lease still held when
     * {@link Locks#close()} runs.
     */
    UNREACHABLE,
    /**
     * The conservative local expiry passed with no renewal waiting for an answer: this process did
     * not run in time to send the due renewal or to read its answer (a blocked renewal thread, a
     * long collector pause, a stopped process), while the server, as far as the client knows, was
     * reachable.
     */
    STALLED,
    /** The caller's bound on the whole hold ({@link HoldOptions#maxHold}) passed. */
    MAX_HOLD,
    /** The server says the lease ended before a renewal noticed (a release found it gone). */
    ENDED,
    /**
     * An operator's {@code DLOCK.REVOKE} ended the lease: heard on the resource's channel, its reason
     * is the exception's {@link LeaseLostException#detail()}.
     */
    REVOKED;

    /**
     * The reason as metrics, logs and errors name it ({@code renewal_refused}).
     *
     * @return the wire name
     */
    public String wireName() {
        return name().toLowerCase(Locale.ROOT);
    }
}
