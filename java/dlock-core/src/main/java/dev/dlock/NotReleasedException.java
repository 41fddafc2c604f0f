package dev.dlock;

/**
 * The work succeeded but its lease could not be released in time: it ends with its ttl. Thrown by
 * {@link Locks#run} and {@link Lease#release()} only when the work itself raised nothing.
 */
public class NotReleasedException extends DlockException {
    private static final long serialVersionUID = 1L;

    /**
     * A failed release.
     *
     * @param resource the lock's key
     * @param fence the lease's fence
     * @param cause why the release failed
     */
    public NotReleasedException(String resource, long fence, Throwable cause) {
        super("dlock: lease on \"" + resource + "\" (fence " + Long.toUnsignedString(fence) + ") not released", cause);
    }
}
