package dev.dlock;

import java.util.List;

/**
 * What {@code DLOCK.INFO} shows of a resource.
 *
 * @param owner the exclusive holder's token, or null
 * @param fence the current fence, or null
 * @param ttlMs what is left of the lease
 * @param waiters how many wait
 * @param nextWaiters the first waiters' tokens
 * @param tickets how many tickets stand in line
 * @param mode {@code exclusive} or {@code shared}, or null (a version 1 server)
 * @param holders how many hold it
 * @param meta the exclusive holder's {@code META}, or null
 * @param leases the shared holders
 */
public record Info(String owner, Long fence, long ttlMs, long waiters, List<String> nextWaiters, long tickets,
        String mode, long holders, String meta, List<Holder> leases) {
    /**
     * One live shared lease.
     *
     * @param token its token
     * @param fence its fence
     * @param ttlMs what is left of it
     * @param meta its {@code META}, or null
     */
    public record Holder(String token, long fence, long ttlMs, String meta) {}
}
