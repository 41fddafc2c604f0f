package dev.dlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.dlock.testkit.Postgres;
import dev.dlock.testkit.Servers;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.Statement;
import java.time.Duration;
import org.junit.jupiter.api.Test;

/**
 * The fenced UPDATE against a real PostgreSQL (from the machine's binaries: scripts/java.sh
 * installs them) with fences from real leases: the store sides with the newest holder.
 */
class FencedJdbcTest {
    private static final String UPDATE = "UPDATE invoice SET status = ?, fence = ? WHERE id = ? AND fence <= ?";
    private static final HoldOptions SHORT = HoldOptions.defaults().ttl(Duration.ofSeconds(5)).noWait();

    @Test
    void aStaleHoldersWriteIsRefusedAndTheNewestHoldersGoesThrough() throws Exception {
        assertTrue(Postgres.available(), "PostgreSQL is needed: apt-get install postgresql, or set DLOCK_PG_BIN");
        try (Postgres postgres = Postgres.start(); Servers.Server server = Servers.start();
                Locks locks = Locks.connect(server.url());
                Connection sql = DriverManager.getConnection(postgres.jdbcUrl)) {
            try (Statement statement = sql.createStatement()) {
                statement.execute("CREATE TABLE invoice (id int PRIMARY KEY, status text NOT NULL, fence bigint NOT NULL DEFAULT 0)");
                statement.execute("INSERT INTO invoice (id, status) VALUES (42, 'draft')");
            }
            Lease first = locks.hold("invoice:42", SHORT);
            assertEquals(1, FencedJdbc.update(sql, first.fence(), UPDATE, "sent", FencedJdbc.FENCE, 42, FencedJdbc.FENCE));
            assertEquals(1, FencedJdbc.update(sql, first.fence(), UPDATE, "sent again", FencedJdbc.FENCE, 42, FencedJdbc.FENCE),
                    "the same fence writes again");

            // An operator's DEL: the first holder does not know yet, and a second one is granted.
            server.command("DEL", "invoice:42");
            try (Lease second = locks.hold("invoice:42", SHORT)) {
                assertTrue(second.fence() > first.fence());
                assertEquals(1, FencedJdbc.update(sql, second.fence(), UPDATE, "paid", FencedJdbc.FENCE, 42, FencedJdbc.FENCE));
                StaleFenceException stale = assertThrows(StaleFenceException.class, () -> FencedJdbc.update(sql, first.fence(),
                        UPDATE, "cancelled", FencedJdbc.FENCE, 42, FencedJdbc.FENCE));
                assertEquals(first.fence(), stale.fence());
                try (Statement statement = sql.createStatement();
                        ResultSet row = statement.executeQuery("SELECT status, fence FROM invoice WHERE id = 42")) {
                    assertTrue(row.next());
                    assertEquals("paid", row.getString(1), "the stale write changed nothing");
                    assertEquals(second.fence(), row.getLong(2));
                }
                // A missing row is refused the same way (0 rows updated).
                assertThrows(StaleFenceException.class, () -> FencedJdbc.update(sql, second.fence(), UPDATE, "paid",
                        FencedJdbc.FENCE, 43, FencedJdbc.FENCE));
            }
            assertThrows(LeaseLostException.class, first::close);
            // A fence of 2^63 or more does not fit a BIGINT: refused before it is sent.
            assertThrows(IllegalArgumentException.class, () -> FencedJdbc.update(sql, -1L, UPDATE, "x", FencedJdbc.FENCE, 42,
                    FencedJdbc.FENCE));
        }
    }
}
