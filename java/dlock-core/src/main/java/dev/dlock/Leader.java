package dev.dlock;

/**
 * Who leads an election.
 *
 * @param token the leading lease's token
 * @param fence the term's fence, larger for every newer term
 * @param address the candidate's address (its lease's {@code META}), or null
 */
public record Leader(String token, long fence, String address) {}
