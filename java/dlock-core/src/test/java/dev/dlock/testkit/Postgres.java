package dev.dlock.testkit;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.DriverManager;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A throwaway PostgreSQL from the machine's binaries ($DLOCK_PG_BIN or the newest
 * /usr/lib/postgresql/N/bin) in a temporary directory on a free loopback port; close() stops it.
 * Without binaries, available() is false (scripts/java.sh installs them and sets
 * DLOCK_REQUIRE_POSTGRES, which turns a missing server into a failure).
 */
public final class Postgres implements AutoCloseable {
    public static final String USER = "dlock";
    private final Path dir;
    private final Process process;
    public final String jdbcUrl;

    private Postgres(Path dir, Process process, int port) {
        this.dir = dir;
        this.process = process;
        this.jdbcUrl = "jdbc:postgresql://127.0.0.1:" + port + "/postgres?user=" + USER;
    }

    static String bin() {
        String given = System.getenv("DLOCK_PG_BIN");
        if (given != null && !given.isEmpty()) {
            return given;
        }
        File[] versions = new File("/usr/lib/postgresql").listFiles();
        if (versions == null) {
            return null;
        }
        return Arrays.stream(versions).filter(v -> new File(v, "bin/initdb").exists())
                .map(File::getName).filter(n -> n.matches("\\d+")).max((a, b) -> Integer.parseInt(a) - Integer.parseInt(b))
                .map(v -> "/usr/lib/postgresql/" + v + "/bin").orElse(null);
    }

    public static boolean available() {
        return bin() != null;
    }

    public static boolean required() {
        return System.getenv("DLOCK_REQUIRE_POSTGRES") != null;
    }

    private static List<String> asPostgres(String program, String... args) {
        List<String> command = new ArrayList<>();
        if ("root".equals(System.getProperty("user.name"))) {
            command.addAll(List.of("runuser", "-u", "postgres", "--"));
        }
        command.add(program);
        command.addAll(List.of(args));
        return command;
    }

    public static Postgres start() throws IOException, InterruptedException {
        String bin = bin();
        Path dir = Files.createTempDirectory("dlock-java-pg-");
        if ("root".equals(System.getProperty("user.name"))) {
            new ProcessBuilder("chown", "-R", "postgres:postgres", dir.toString()).inheritIO().start().waitFor();
        }
        Path data = dir.resolve("data");
        Process init = new ProcessBuilder(asPostgres(bin + "/initdb", "-D", data.toString(), "-A", "trust", "-U", USER,
                "--no-sync", "-E", "UTF8", "--locale=C")).redirectErrorStream(true).redirectOutput(dir.resolve("initdb.log").toFile()).start();
        if (init.waitFor() != 0) {
            throw new IllegalStateException("initdb failed: " + Files.readString(dir.resolve("initdb.log")));
        }
        int port = Servers.freePort();
        Process server = new ProcessBuilder(asPostgres(bin + "/postgres", "-D", data.toString(), "-p", Integer.toString(port),
                "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + dir, "-c", "fsync=off",
                "-c", "synchronous_commit=off", "-c", "full_page_writes=off"))
                .redirectErrorStream(true).redirectOutput(dir.resolve("postgres.log").toFile()).start();
        Postgres postgres = new Postgres(dir, server, port);
        long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
        while (System.nanoTime() < deadline) {
            try {
                DriverManager.getConnection(postgres.jdbcUrl).close();
                return postgres;
            } catch (java.sql.SQLException e) {
                if (!server.isAlive()) {
                    break;
                }
                Thread.sleep(50);
            }
        }
        postgres.close();
        throw new IllegalStateException("postgres did not start: " + Files.readString(dir.resolve("postgres.log")));
    }

    @Override
    public void close() {
        // The child may be runuser: stop the server by its pid file.
        try {
            Path pid = dir.resolve("data/postmaster.pid");
            if (Files.exists(pid)) {
                String first = Files.readAllLines(pid).get(0).trim();
                new ProcessBuilder("kill", "-INT", first).start().waitFor();
            }
            if (!process.waitFor(10, TimeUnit.SECONDS)) {
                process.destroyForcibly();
            }
        } catch (IOException | InterruptedException e) {
            process.destroyForcibly();
        }
        Servers.deleteTree(dir);
    }
}
