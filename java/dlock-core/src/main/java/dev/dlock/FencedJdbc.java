package dev.dlock;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;

/**
 * The fenced UPDATE for a store outside Redis ({@code docs/protocol.md}, section 6): the row keeps
 * the highest fence that wrote it, and a write goes through only when the lease's fence is at
 * least that. A newer holder's fence is always larger, so the store sides with the current holder.
 *
 * <pre>{@code
 * FencedJdbc.update(connection, lease.fence(),
 *     "UPDATE invoice SET status = ?, fence = ? WHERE id = ? AND fence <= ?",
 *     "paid", FencedJdbc.FENCE, 42, FencedJdbc.FENCE);
 * }</pre>
 */
public final class FencedJdbc {
    /** A placeholder for the lease's fence among the statement's parameters. */
    public static final Object FENCE = new Object() {
        @Override
        public String toString() {
            return "FENCE";
        }
    };

    private FencedJdbc() {}

    /**
     * Runs a fenced UPDATE: {@code sql} must write the fence column and guard it with
     * {@code fence <= ?}; each {@link #FENCE} among the parameters is bound to {@code fence} (as a
     * signed 64-bit number: fences below 2^63 compare correctly in SQL's BIGINT).
     *
     * @param connection the connection (its transaction is the caller's)
     * @param fence the lease's fence
     * @param sql the UPDATE
     * @param parameters its parameters, {@link #FENCE} where the fence goes
     * @return the rows updated (at least 1)
     * @throws StaleFenceException if no row was updated: a newer fence wrote it (or the row is missing)
     * @throws SQLException from the driver
     */
    public static int update(Connection connection, long fence, String sql, Object... parameters) throws SQLException {
        if (fence < 0) {
            throw new IllegalArgumentException("a fence of 2^63 or more does not fit a BIGINT column");
        }
        try (PreparedStatement statement = connection.prepareStatement(sql)) {
            for (int i = 0; i < parameters.length; i++) {
                statement.setObject(i + 1, parameters[i] == FENCE ? Long.valueOf(fence) : parameters[i]);
            }
            int rows = statement.executeUpdate();
            if (rows == 0) {
                throw new StaleFenceException(sql, fence, "0 rows updated: a newer fence wrote the row, or it is missing");
            }
            return rows;
        }
    }
}
