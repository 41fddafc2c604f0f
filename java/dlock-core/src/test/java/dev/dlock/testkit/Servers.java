package dev.dlock.testkit;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * Real servers for the tests: redis-server (or $DLOCK_SERVER, e.g. a valkey-server) with the dlock
 * module on its own port and directory, a Redis Cluster of three primaries, and a throwaway
 * PostgreSQL. Each has a start-up deadline and is stopped by close(). Nothing assumes port 6379.
 */
public final class Servers {
    private static final Duration START_DEADLINE = Duration.ofSeconds(20);

    private Servers() {}

    /** The repository's top directory: $DLOCK_REPO, else the first parent with Cargo.toml and java/. */
    public static Path repoRoot() {
        String given = System.getenv("DLOCK_REPO");
        if (given != null && Files.exists(Paths.get(given, "Cargo.toml"))) {
            return Paths.get(given).toAbsolutePath().normalize();
        }
        Path dir = Paths.get("").toAbsolutePath();
        while (dir != null) {
            if (Files.exists(dir.resolve("Cargo.toml")) && Files.isDirectory(dir.resolve("java"))) {
                return dir;
            }
            dir = dir.getParent();
        }
        throw new IllegalStateException("no repository root above the working directory");
    }

    /** The module under test: $DLOCK_MODULE, else the newest of target/release and target/debug. */
    public static Path modulePath() {
        String given = System.getenv("DLOCK_MODULE");
        if (given != null && !given.isEmpty()) {
            return Paths.get(given).toAbsolutePath();
        }
        Path root = repoRoot();
        return List.of("target/release/libdlock.so", "target/debug/libdlock.so").stream()
                .map(root::resolve).filter(Files::exists)
                .max(Comparator.comparing(p -> p.toFile().lastModified()))
                .orElseThrow(() -> new IllegalStateException("libdlock.so not found: run `cargo build -p dlock` or set DLOCK_MODULE"));
    }

    /** The server under test: $DLOCK_SERVER, or redis-server. */
    public static String serverBinary() {
        String given = System.getenv("DLOCK_SERVER");
        return given != null && !given.isEmpty() ? given : "redis-server";
    }

    /** A loopback port nobody listens on right now. */
    public static int freePort() {
        try (ServerSocket socket = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
            return socket.getLocalPort();
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }

    /** One running server with the module. */
    public static final class Server implements AutoCloseable {
        public final int port;
        public final Path dir;
        private Process process;

        Server(int port, Path dir, Process process) {
            this.port = port;
            this.dir = dir;
            this.process = process;
        }

        /** redis://127.0.0.1:port */
        public String url() {
            return "redis://127.0.0.1:" + port;
        }

        public String addr() {
            return "127.0.0.1:" + port;
        }

        /** Sends one command (RESP2) on a fresh connection and returns the raw reply's first line, or the whole bulk string. */
        public String command(String... args) {
            return Resp.command(port, args);
        }

        public void pause() {
            signal("STOP");
        }

        public void resume() {
            signal("CONT");
        }

        private void signal(String name) {
            try {
                new ProcessBuilder("kill", "-" + name, Long.toString(process.pid())).start().waitFor();
            } catch (IOException e) {
                throw new IllegalStateException(e);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }

        public String log() {
            try {
                return Files.readString(dir.resolve("server.log"));
            } catch (IOException e) {
                return "";
            }
        }

        @Override
        public void close() {
            if (process != null) {
                resume();
                process.destroyForcibly();
                try {
                    process.waitFor(10, TimeUnit.SECONDS);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                process = null;
            }
            deleteTree(dir);
        }
    }

    /** Starts a server without persistence; extra arguments come after the defaults. */
    public static Server start(String... extra) {
        Path module = modulePath();
        Path dir;
        try {
            dir = Files.createTempDirectory("dlock-java-test-");
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
        IllegalStateException last = null;
        for (int attempt = 0; attempt < 5; attempt++) {
            int port = freePort();
            List<String> command = new ArrayList<>(List.of(serverBinary(), "--port", Integer.toString(port),
                    "--bind", "127.0.0.1", "--dir", dir.toString(), "--logfile", dir.resolve("server.log").toString(),
                    "--save", "", "--appendonly", "no", "--enable-debug-command", "yes",
                    "--loadmodule", module.toString()));
            command.addAll(List.of(extra));
            try {
                Process process = new ProcessBuilder(command).redirectErrorStream(true)
                        .redirectOutput(dir.resolve("stdout.log").toFile()).start();
                long deadline = System.nanoTime() + START_DEADLINE.toNanos();
                while (System.nanoTime() < deadline) {
                    if (!process.isAlive()) {
                        break;
                    }
                    try {
                        String info = Resp.command(port, "INFO", "server");
                        if (info.contains("process_id:" + process.pid() + "\r")) {
                            return new Server(port, dir, process);
                        }
                    } catch (RuntimeException e) {
                        // not up yet
                    }
                    Thread.sleep(20);
                }
                process.destroyForcibly();
                last = new IllegalStateException(serverBinary() + " did not start on " + port + ": "
                        + Files.readString(dir.resolve("stdout.log")) + readLog(dir));
            } catch (IOException e) {
                throw new IllegalStateException(serverBinary() + " must be installed (make deps)", e);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IllegalStateException(e);
            }
        }
        deleteTree(dir);
        throw last;
    }

    private static String readLog(Path dir) {
        try {
            return Files.readString(dir.resolve("server.log"));
        } catch (IOException e) {
            return "";
        }
    }

    /** A Redis Cluster of three primaries (no replicas), the module on each. */
    public static final class Cluster implements AutoCloseable {
        public final List<Server> nodes = new ArrayList<>();

        /** The seeds as DLOCK_URL writes them: redis://a,redis://b,redis://c */
        public String url() {
            return String.join(",", nodes.stream().map(Server::url).toList());
        }

        /** The primary serving the key's slot: the node that does not answer MOVED. */
        public Server owner(String key) {
            return nodes.stream().filter(n -> !n.command("DLOCK.INFO", key).startsWith("-MOVED")).findFirst()
                    .orElseThrow();
        }

        /**
         * Moves the key's slot, with the key, from the node serving it to {@code to} as redis-cli
         * --cluster reshard does: IMPORTING, MIGRATING, MIGRATE of the key, SETSLOT NODE on every node.
         */
        public void moveSlot(String key, Server to) {
            Server from = owner(key);
            String slot = from.command("CLUSTER", "KEYSLOT", key).substring(1);
            String fromId = from.command("CLUSTER", "MYID");
            String toId = to.command("CLUSTER", "MYID");
            expectOk(to.command("CLUSTER", "SETSLOT", slot, "IMPORTING", fromId));
            expectOk(from.command("CLUSTER", "SETSLOT", slot, "MIGRATING", toId));
            String migrated = from.command("MIGRATE", "127.0.0.1", Integer.toString(to.port), key, "0", "5000");
            if (!migrated.equals("+OK") && !migrated.equals("+NOKEY")) {
                throw new IllegalStateException("MIGRATE: " + migrated);
            }
            for (Server node : nodes) {
                expectOk(node.command("CLUSTER", "SETSLOT", slot, "NODE", toId));
            }
        }

        private static void expectOk(String reply) {
            if (!reply.equals("+OK")) {
                throw new IllegalStateException(reply);
            }
        }

        @Override
        public void close() {
            nodes.forEach(Server::close);
        }
    }

    /** Starts three nodes and joins them with redis-cli --cluster create; returns once every node says ok. */
    public static Cluster startCluster() {
        Cluster cluster = new Cluster();
        try {
            for (int i = 0; i < 3; i++) {
                cluster.nodes.add(start("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                        "--cluster-node-timeout", "15000"));
            }
            List<String> command = new ArrayList<>(List.of("redis-cli", "--cluster", "create"));
            cluster.nodes.forEach(n -> command.add(n.addr()));
            command.addAll(List.of("--cluster-replicas", "0", "--cluster-yes"));
            Process create = new ProcessBuilder(command).redirectErrorStream(true).start();
            String output = new String(create.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
            if (create.waitFor() != 0) {
                throw new IllegalStateException("redis-cli --cluster create: " + output);
            }
            long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
            for (Server node : cluster.nodes) {
                while (!node.command("CLUSTER", "INFO").contains("cluster_state:ok")) {
                    if (System.nanoTime() > deadline) {
                        throw new IllegalStateException("cluster not ok on " + node.addr());
                    }
                    Thread.sleep(50);
                }
            }
            return cluster;
        } catch (IOException | InterruptedException | RuntimeException e) {
            cluster.close();
            throw new IllegalStateException(e);
        }
    }

    static void deleteTree(Path dir) {
        try (var paths = Files.walk(dir)) {
            paths.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        } catch (IOException e) {
            // already gone
        }
    }

    /** A minimal RESP2 client for the tests' own admin commands (the client under test is Lettuce). */
    static final class Resp {
        static String command(int port, String... args) {
            try (Socket socket = new Socket()) {
                socket.connect(new InetSocketAddress("127.0.0.1", port), 1000);
                socket.setSoTimeout(5000);
                OutputStream out = socket.getOutputStream();
                StringBuilder request = new StringBuilder("*" + args.length + "\r\n");
                for (String arg : args) {
                    request.append('$').append(arg.getBytes(StandardCharsets.UTF_8).length).append("\r\n").append(arg).append("\r\n");
                }
                out.write(request.toString().getBytes(StandardCharsets.UTF_8));
                out.flush();
                InputStream in = socket.getInputStream();
                String line = readLine(in);
                if (line.startsWith("$") && !line.equals("$-1")) {
                    int length = Integer.parseInt(line.substring(1));
                    byte[] body = in.readNBytes(length + 2);
                    return new String(body, 0, length, StandardCharsets.UTF_8);
                }
                return line;
            } catch (IOException e) {
                throw new IllegalStateException(e);
            }
        }

        private static String readLine(InputStream in) throws IOException {
            StringBuilder line = new StringBuilder();
            int c;
            while ((c = in.read()) != -1) {
                if (c == '\r') {
                    in.read();
                    break;
                }
                line.append((char) c);
            }
            return line.toString();
        }
    }
}
