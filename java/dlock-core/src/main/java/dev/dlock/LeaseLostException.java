package dev.dlock;

/** The lease ended before the work did: work after that was not protected. */
public class LeaseLostException extends DlockException {
    private static final long serialVersionUID = 1L;

    private final String resource;
    private final long fence;
    private final LossReason reason;

    /**
     * A lost lease.
     *
     * @param resource the lock's key
     * @param fence the lease's fence
     * @param reason why it was lost
     */
    public LeaseLostException(String resource, long fence, LossReason reason) {
        super("dlock: lease on \"" + resource + "\" (fence " + Long.toUnsignedString(fence) + ") lost: " + reason.wireName());
        this.resource = resource;
        this.fence = fence;
        this.reason = reason;
    }

    /**
     * The same loss thrown again, with the first report as its cause: each throw is its own
     * exception (Java refuses to add an exception to itself as suppressed, which a
     * try-with-resources block whose body and close both report the loss would do).
     */
    LeaseLostException(LeaseLostException first) {
        super(first.getMessage(), first);
        this.resource = first.resource;
        this.fence = first.fence;
        this.reason = first.reason;
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
     * The lost lease's fence.
     *
     * @return the fence
     */
    public long fence() {
        return fence;
    }

    /**
     * Why it was lost.
     *
     * @return the reason
     */
    public LossReason reason() {
        return reason;
    }
}
