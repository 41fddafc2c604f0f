package dev.dlock;

import java.util.Locale;

/** The class of a server's error reply: what the client does next ({@code docs/protocol.md}, section 9). */
public enum ErrorClass {
    /** {@code MOVED}, {@code ASK}: followed. */
    REDIRECT,
    /** {@code TRYAGAIN}, {@code LOADING}, {@code CLUSTERDOWN}, {@code MASTERDOWN}: nothing ran, retried. */
    RETRY,
    /** {@code READONLY}: a demoted primary, retried on the new one. */
    FAILOVER,
    /** {@code UNBLOCKED}: a wait ended by the server, retried. */
    UNBLOCKED,
    /** {@code STALE}: the fenced write did not happen. */
    STALE,
    /** {@code CROSSSLOT}: a fenced command's key is outside the resource's slot. */
    CROSS_SLOT,
    /** {@code LOCKMODE}: the token holds the other mode, a caller's bug. */
    MODE_CONFLICT,
    /** An option the module does not know: it is older. */
    UNSUPPORTED,
    /** {@code NOAUTH}, {@code WRONGPASS}, {@code NOPERM}: configuration, not retried. */
    AUTH,
    /** {@code WRONGTYPE}: the key is not a lock. */
    WRONG_TYPE,
    /** Any other {@code ERR}: a caller's bug or a server setting. */
    USAGE,
    /** Anything else: not retried. */
    SERVER;

    /**
     * The class's name as the contract writes it ({@code cross_slot}).
     *
     * @return the wire name
     */
    public String wireName() {
        return name().toLowerCase(Locale.ROOT);
    }
}
