package dev.dlock;

import java.util.ArrayList;
import java.util.List;

/** The lease ended before the work did: work after that was not protected. */
public class LeaseLostException extends DlockException {
    private static final long serialVersionUID = 1L;

    private final String resource;
    private final long fence;
    private final List<String> resources;
    private final List<Long> fences;
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
        this(resource, fence, List.of(resource), List.of(fence), reason, detail);
    }

    /** A lost set ({@link Locks#holdAll}): lost whole, whichever member ended. */
    LeaseLostException(List<String> resources, long[] fences, LossReason reason, String detail) {
        this(resources.get(0), fences[0], resources, boxed(fences), reason, detail);
    }

    private LeaseLostException(String resource, long fence, List<String> resources, List<Long> fences, LossReason reason,
            String detail) {
        super("dlock: " + (resources.size() == 1 && resources.get(0).equals(resource) && fences.size() == 1 ? "lease" : "set")
                + " on \"" + String.join(",", resources) + "\" (fence " + joined(fences) + ") lost: " + reason.wireName()
                + (detail == null || detail.isEmpty() ? "" : ": " + detail));
        this.resource = resource;
        this.fence = fence;
        this.resources = List.copyOf(resources);
        this.fences = List.copyOf(fences);
        this.reason = reason;
        this.detail = detail == null ? "" : detail;
    }

    private static List<Long> boxed(long[] fences) {
        List<Long> out = new ArrayList<>(fences.length);
        for (long fence : fences) {
            out.add(fence);
        }
        return out;
    }

    private static String joined(List<Long> fences) {
        StringBuilder out = new StringBuilder();
        for (long fence : fences) {
            out.append(out.length() == 0 ? "" : ",").append(Long.toUnsignedString(fence));
        }
        return out.toString();
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
        this.resources = first.resources;
        this.fences = first.fences;
        this.reason = first.reason;
        this.detail = first.detail;
    }

    /**
     * The lock's key (a set's: its first member).
     *
     * @return the resource
     */
    public String resource() {
        return resource;
    }

    /**
     * The lost lease's fence (a set's: its first member's).
     *
     * @return the fence
     */
    public long fence() {
        return fence;
    }

    /**
     * Every resource of the lost lease: a set's members in the order they were asked for, or the
     * one resource of a single lease.
     *
     * @return the resources
     */
    public List<String> resources() {
        return resources;
    }

    /**
     * Their fences, in the order of {@link #resources()}.
     *
     * @return the fences
     */
    public List<Long> fences() {
        return fences;
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
