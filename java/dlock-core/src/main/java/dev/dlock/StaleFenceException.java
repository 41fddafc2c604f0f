package dev.dlock;

/**
 * A fenced write was refused because its fence no longer holds the resource (a newer holder has a
 * larger one): nothing was written.
 */
public class StaleFenceException extends DlockException {
    private static final long serialVersionUID = 1L;

    private final String resource;
    private final long fence;

    /**
     * A refused write.
     *
     * @param resource the lock's key
     * @param fence the stale fence
     * @param detail the server's reply, or what refused it
     */
    public StaleFenceException(String resource, long fence, String detail) {
        super("dlock: stale fence " + Long.toUnsignedString(fence) + " on \"" + resource + "\": " + detail);
        this.resource = resource;
        this.fence = fence;
    }

    /**
     * The lock's key.
     *
     * @return the resource
     */
    public String resource() {
        return resource;
    }

    /**
     * The fence that no longer holds.
     *
     * @return the fence
     */
    public long fence() {
        return fence;
    }
}
