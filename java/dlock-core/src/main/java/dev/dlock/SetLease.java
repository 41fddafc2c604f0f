package dev.dlock;

import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletionStage;

/**
 * A granted set ({@link Locks#holdAll}): one token owns every one of {@link #resources()}, each
 * with a fence of its own, kept alive together by renewals ({@code DLOCK.RENEWALL} with the fences,
 * every ttl/3) until it is closed or lost. It is one lease with a {@link Lease}'s rules: the loss
 * of any member (a renewal refused because one expired or was deleted, a revocation of one) is the
 * loss of the whole set, and its local expiry is the set's. Close it with try-with-resources:
 * {@link #close()} releases every member ({@code DLOCK.RELEASEALL} with the fences), and throws
 * {@link LeaseLostException} if the set was lost meanwhile, or if fewer than every member were
 * still held ({@link LossReason#ENDED}).
 */
public final class SetLease implements AutoCloseable {
    private final Locks locks;
    private final List<String> resources;
    private final Lease lease; // the set's lifecycle: renewals, local expiry, loss, release

    SetLease(Locks locks, List<String> resources, Lease lease) {
        this.locks = locks;
        this.resources = List.copyOf(resources);
        this.lease = lease;
    }

    /**
     * The set's resources, in the order they were asked for.
     *
     * @return the resources
     */
    public List<String> resources() {
        return resources;
    }

    /**
     * Each member's fencing token, in the order of {@link #resources()}.
     *
     * @return the fences
     */
    public List<Long> fences() {
        return Arrays.stream(lease.memberFences()).boxed().toList();
    }

    /**
     * The fencing token of the member {@code resource}: send it with every write that member
     * protects.
     *
     * @param resource one of the set's resources
     * @return its fence
     * @throws IllegalArgumentException if {@code resource} is not in the set
     */
    public long fence(String resource) {
        int index = resources.indexOf(resource);
        if (index < 0) {
            throw new IllegalArgumentException("\"" + resource + "\" is not in the set " + resources);
        }
        return lease.memberFences()[index];
    }

    /**
     * The set's owner token: random, made before the first ACQUIREALL, secret to the holder.
     *
     * @return the token
     */
    public String token() {
        return lease.token();
    }

    /**
     * Each lease's length as the server was sent it; the set is renewed every third of it.
     *
     * @return the ttl
     */
    public Duration ttl() {
        return lease.ttl();
    }

    /**
     * Whether the set is lost (see {@link Lease#isLost()}).
     *
     * @return true once lost
     */
    public boolean isLost() {
        return lease.isLost();
    }

    /**
     * Why the set was lost.
     *
     * @return the reason, or empty while it holds
     */
    public Optional<LossReason> lostReason() {
        return lease.lostReason();
    }

    /**
     * Throws if the set is lost, or if its local expiry passed without an answered renewal (see
     * {@link Lease#check()}). Call it between the steps of long work.
     *
     * @throws LeaseLostException if the set no longer protects the work
     */
    public void check() {
        lease.check();
    }

    /**
     * Completes with the {@link LeaseLostException} the moment the set is known lost; never
     * completes for a set released in time.
     *
     * @return the loss, later
     */
    public CompletionStage<LeaseLostException> whenLost() {
        return lease.whenLost();
    }

    /**
     * A conservative end of the set on this process's monotonic clock ({@link System#nanoTime()}).
     *
     * @return the local expiry in nanoTime
     */
    public long localExpiryNanos() {
        return lease.localExpiryNanos();
    }

    /**
     * Sends a RENEWALL now (the scheduler also does, every ttl/3).
     *
     * @return true renewed; false refused (a member is gone), and the set is lost
     * @throws LeaseLostException if the set was lost before, or its local expiry passed
     * @throws DlockException if no answer came in time
     */
    public boolean renew() {
        return lease.renew();
    }

    /**
     * Stops the renewals and releases every member ({@code DLOCK.RELEASEALL} with the fences) in
     * one request bounded by the release timeout. Later calls do nothing.
     *
     * @throws LeaseLostException if the set was lost before, or a member was found gone now
     *     ({@link LossReason#ENDED})
     * @throws NotReleasedException if the server did not answer in time (the leases end with their ttl)
     */
    public void release() {
        lease.release();
    }

    /**
     * Releases the set ({@link #release()}): the end of a try-with-resources block.
     *
     * @throws LeaseLostException if the set was lost while the block ran
     * @throws NotReleasedException if it could not be released in time
     */
    @Override
    public void close() {
        release();
    }

    /**
     * Runs the work under this set and releases it after, with {@link Lease#run}'s rules: the
     * work's thread is interrupted the moment the set is lost; the work's own exception is the one
     * thrown (a loss or failed release added as suppressed); a loss is never hidden.
     *
     * @param <T> the work's result
     * @param work the protected work
     * @return the work's result
     * @throws Exception the work's own exception
     */
    public <T> T run(Locks.SetWork<T> work) throws Exception {
        return lease.run(held -> work.call(this));
    }

    /**
     * Runs a command in the server only if the member {@code resource}'s fence still holds it
     * ({@code DLOCK.FENCED}); see {@link Locks#fenced}.
     *
     * @param resource the member whose fence guards the command
     * @param command the command and its arguments
     * @return the command's reply
     * @throws StaleFenceException if the fence no longer holds: nothing ran
     */
    public Object fenced(String resource, String... command) {
        return locks.fenced(resource, fence(resource), Arrays.asList(command));
    }

    /**
     * Whether the member {@code resource}'s fence still holds it on the server.
     *
     * @param resource one of the set's resources
     * @return true while it holds
     */
    public boolean fenceCheck(String resource) {
        return locks.fenceCheck(resource, fence(resource));
    }

    @Override
    public String toString() {
        return "SetLease[" + lease.name() + ", fences " + lease.fenceName() + (isLost() ? ", lost" : "") + "]";
    }
}
