package dev.dlock;

/** The lease ended before the work did: work after that was not protected. */
public class LeaseLostException extends DlockException {
    private static final long serialVersionUID = 1L;

    private final String resource;
    private final long fence;
    private final LossReason reason;
    private final String detail;

    /**
     * A lost lease.
     *
     * @param resource the lock's key
     * @param fence the lease's fence
     * @param reason why it was lost
     */
    public LeaseLostException(String resource, long fence, LossReason reason) {
        this(resource, fence, reason, "");
    }

    /**
     * A lost lease, with what the server said of it.
     *
     * @param resource the lock's key
     * @param fence the lease's fence
     * @param reason why it was lost
     * @param detail with {@link LossReason#REVOKED}, the reason the operator gave; empty (or null) for none
     */
    public LeaseLostException(String resource, long fence, LossReason reason, String detail) {
        super("dlock: lease on \"" + resource + "\" (fence " + Long.toUnsignedString(fence) + ") lost: " + reason.wireName()
                + (detail == null || detail.isEmpty() ? "" : ": " + detail));
        this.resource = resource;
        this.fence = fence;
        this.reason = reason;
        this.detail = detail == null ? "" : detail;
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
        this.detail = first.detail;
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

    /**
     * What the server said of the loss: with {@link LossReason#REVOKED}, the reason the operator
     * gave {@code DLOCK.REVOKE} (empty if none); empty for every other reason.
     *
     * @return the detail, never null
     */
    public String detail() {
        return detail;
    }
}
