package dev.dlock.conformance;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import dev.dlock.HoldOptions;
import dev.dlock.Lease;
import dev.dlock.LeaseLostException;
import dev.dlock.Leader;
import dev.dlock.Locks;
import dev.dlock.LossReason;
import dev.dlock.NotAcquiredException;
import dev.dlock.NotReleasedException;
import dev.dlock.ServerErrorException;
import dev.dlock.SetLease;
import dev.dlock.StaleFenceException;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.cluster.RedisClusterClient;
import io.lettuce.core.resource.ClientResources;
import io.lettuce.core.resource.DefaultClientResources;
import io.lettuce.core.resource.DefaultEventLoopGroupProvider;
import io.netty.channel.EventLoopGroup;
import io.netty.util.concurrent.EventExecutorGroup;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.OutputStreamWriter;
import java.io.UncheckedIOException;
import java.io.Writer;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.Callable;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Phaser;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The Java client's conformance driver ({@code docs/protocol.md}, section 14): one JSON request per
 * line on stdin, one JSON reply or event per line on stdout, logs on stderr. It connects to
 * {@code $DLOCK_URL} (a {@code redis://} URL, or several separated by commas: a cluster's seeds),
 * says {@code ready}, serves every request on a thread of its own, and exits when stdin closes
 * (after answering the requests already read, for at most 2 s), releasing nothing on purpose.
 *
 * <p>A held lease needs no thread of its own here: the {@link Locks}' scheduler renews it until a
 * {@code release} or the end of a {@code run}, whose work runs in {@link Lease#run} (a set's, from
 * {@code hold_all}, in {@link SetLease#run}).
 */
public final class Driver {
    /** After stdin closes, how long the requests already read may take to be answered. */
    private static final Duration CLOSING_GRACE = Duration.ofSeconds(2);

    private static final ObjectMapper JSON = new ObjectMapper();
    private static final JsonNodeFactory NODES = JsonNodeFactory.instance;

    private final Locks locks;
    private final Writer out;
    private final Map<String, Held> leases = new ConcurrentHashMap<>();
    private final ExecutorService requests;

    /**
     * A lease (or a set: {@code hold_all}) the harness named: whether its hold ended (a release, a
     * run) and its loss was reported.
     */
    private static final class Held {
        final Lease lease; // null for a set
        final SetLease set; // null for a single lease
        final AtomicBoolean ended = new AtomicBoolean();
        final AtomicBoolean lossReported = new AtomicBoolean();

        Held(Lease lease, SetLease set) {
            this.lease = lease;
            this.set = set;
        }

        Optional<LossReason> lostReason() {
            return lease != null ? lease.lostReason() : set.lostReason();
        }

        CompletionStage<LeaseLostException> whenLost() {
            return lease != null ? lease.whenLost() : set.whenLost();
        }

        void release() {
            if (lease != null) {
                lease.release();
            } else {
                set.release();
            }
        }

        <T> T run(Callable<T> work) throws Exception {
            return lease != null ? lease.run(held -> work.call()) : set.run(held -> work.call());
        }

        /** A fenced write under the lease's fence; a set's under the fence of the member {@code resource}. */
        Object fenced(String resource, String[] command) {
            if (lease != null) {
                return lease.fenced(command);
            }
            if (resource == null) {
                throw new Usage("fenced on a set needs the member's resource");
            }
            return set.fenced(resource, command);
        }
    }

    /** The work's own failure (a run with {@code fail}). */
    static final class WorkFailed extends RuntimeException {
        private static final long serialVersionUID = 1L;

        WorkFailed() {
            super("the work failed");
        }
    }

    /** A request the driver cannot serve as asked (a missing field, an unknown op or lease). */
    static final class Usage extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Usage(String message) {
            super(message);
        }
    }

    /** A run of a lease whose hold already ended (released, or its run over): kind lost. */
    static final class Ended extends RuntimeException {
        private static final long serialVersionUID = 1L;
        final transient Optional<LossReason> reason;

        Ended(String lease, Optional<LossReason> reason) {
            super("the hold of " + lease + " already ended");
            this.reason = reason;
        }
    }

    Driver(Locks locks, OutputStream out) {
        this.locks = locks;
        this.out = new OutputStreamWriter(out, StandardCharsets.UTF_8);
        AtomicInteger count = new AtomicInteger();
        this.requests = Executors.newCachedThreadPool(runnable -> {
            Thread thread = new Thread(runnable, "driver-request-" + count.incrementAndGet());
            thread.setDaemon(true);
            return thread;
        });
    }

    /**
     * Runs the driver on stdin and stdout with {@code $DLOCK_URL}.
     *
     * @param args none
     */
    public static void main(String[] args) {
        String url = System.getenv("DLOCK_URL");
        if (url == null || url.isBlank()) {
            System.err.println("dlock conformance driver: DLOCK_URL is not set");
            System.exit(2);
        }
        EventLoops loops = new EventLoops();
        ClientResources resources = DefaultClientResources.builder().eventLoopGroupProvider(loops).build();
        int status;
        try {
            status = new Driver(connect(url, resources), System.out).serve(System.in);
        } catch (RuntimeException e) {
            e.printStackTrace();
            status = 2;
        }
        System.out.flush();
        // No Locks.close(): the leases still held are released by nobody. The event loops stop
        // first (closing the connections, as the exit would), or the JVM's exit would wait 300 ms
        // for their threads, blocked in native code.
        loops.stop();
        Runtime.getRuntime().halt(status);
    }

    /** Lettuce's event loop groups, remembered so that the exit can stop them at once. */
    static final class EventLoops extends DefaultEventLoopGroupProvider {
        private final Set<EventExecutorGroup> groups = ConcurrentHashMap.newKeySet();

        EventLoops() {
            super(Math.max(2, Runtime.getRuntime().availableProcessors()));
        }

        @Override
        public <T extends EventLoopGroup> T allocate(Class<T> type) {
            T group = super.allocate(type);
            groups.add(group);
            return group;
        }

        void stop() {
            groups.forEach(group -> group.shutdownGracefully(0, 200, TimeUnit.MILLISECONDS));
            groups.forEach(group -> group.terminationFuture().awaitUninterruptibly(500));
        }
    }

    /** Locks on one URL, or on a cluster whose seeds are URLs separated by commas. */
    static Locks connect(String url, ClientResources resources) {
        List<RedisURI> uris = new ArrayList<>();
        for (String part : url.split(",")) {
            uris.add(RedisURI.create(part.trim()));
        }
        if (uris.size() == 1) {
            return Locks.create(RedisClient.create(resources), uris.get(0));
        }
        return Locks.create(RedisClusterClient.create(resources, uris), uris.get(0));
    }

    /**
     * Connects (a first request, so that no lease's local expiry counts the connection's opening),
     * says ready, then serves the lines of {@code in} until it closes.
     *
     * @return the exit status
     */
    int serve(InputStream in) {
        locks.info("dlock-conformance:warm-up");
        write(object().put("event", "ready").put("client", "dlock (Java) " + version()));
        Phaser inFlight = new Phaser(1);
        try (BufferedReader lines = new BufferedReader(new InputStreamReader(in, StandardCharsets.UTF_8))) {
            String line;
            while ((line = lines.readLine()) != null) {
                if (line.isBlank()) {
                    continue;
                }
                JsonNode request;
                try {
                    request = JSON.readTree(line);
                } catch (IOException e) {
                    System.err.println("dlock conformance driver: not JSON: " + line);
                    continue;
                }
                if (!request.has("id")) {
                    System.err.println("dlock conformance driver: not a request: " + line);
                    continue;
                }
                inFlight.register();
                requests.execute(() -> {
                    try {
                        serveOne(request);
                    } finally {
                        inFlight.arriveAndDeregister();
                    }
                });
            }
        } catch (IOException e) {
            System.err.println("dlock conformance driver: stdin: " + e);
        }
        try {
            inFlight.awaitAdvanceInterruptibly(inFlight.arrive(), CLOSING_GRACE.toMillis(), TimeUnit.MILLISECONDS);
        } catch (InterruptedException | TimeoutException e) {
            // Requests still running (a wait) are dropped with the process.
        }
        return 0;
    }

    private static String version() {
        String version = Driver.class.getPackage().getImplementationVersion();
        return version != null ? version : "dev";
    }

    private static ObjectNode object() {
        return NODES.objectNode();
    }

    private void write(ObjectNode line) {
        String text;
        try {
            text = JSON.writeValueAsString(line);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        synchronized (out) {
            try {
                out.write(text);
                out.write('\n');
                out.flush();
            } catch (IOException e) {
                System.err.println("dlock conformance driver: stdout: " + e);
                Runtime.getRuntime().halt(1);
            }
        }
    }

    private void serveOne(JsonNode request) {
        JsonNode id = request.get("id");
        ObjectNode reply = object().set("id", id);
        try {
            reply.set("ok", handle(request));
        } catch (Throwable e) {
            reply.set("error", describe(e));
        }
        write(reply);
    }

    private JsonNode handle(JsonNode request) throws Exception {
        String op = text(request, "op");
        switch (op) {
            case "hold": case "wait": case "ticket": case "shared": case "semaphore":
                return hold(op, request);
            case "hold_all":
                return holdAll(request);
            case "campaign":
                return campaign(request);
            case "release":
                return release(request);
            case "run":
                return run(request);
            case "fenced":
                return fenced(request);
            case "observe":
                return observe(request);
            default:
                throw new Usage("unknown op " + op);
        }
    }

    private JsonNode hold(String op, JsonNode request) {
        HoldOptions options = HoldOptions.defaults().ttl(millis(request, "ttl_ms"));
        options = request.hasNonNull("wait_ms") ? options.waitFor(millis(request, "wait_ms")) : options.noWait();
        if (request.hasNonNull("meta")) {
            options = options.meta(text(request, "meta"));
        }
        if (request.hasNonNull("max_hold_ms")) {
            options = options.maxHold(millis(request, "max_hold_ms"));
        }
        String strategy = op.equals("wait") ? "block" : op.equals("ticket") ? "tickets" : optionalText(request, "strategy", "block");
        switch (strategy) {
            case "block":
                options = options.blocking();
                break;
            case "tickets":
                options = options.tickets(request.hasNonNull("ticket_ms") ? millis(request, "ticket_ms") : Duration.ofMillis(6000));
                break;
            default:
                throw new Usage("unknown strategy " + strategy);
        }
        String mode = op.equals("shared") ? "shared" : op.equals("semaphore") ? "permits" : optionalText(request, "mode", "exclusive");
        String resource = text(request, "resource");
        Lease lease;
        switch (mode) {
            case "exclusive":
                lease = locks.hold(resource, options);
                break;
            case "shared":
                lease = locks.read(resource, options);
                break;
            case "permits":
                lease = locks.semaphore(resource, request.path("permits").asInt(0), options);
                break;
            default:
                throw new Usage("unknown mode " + mode);
        }
        keep(text(request, "lease"), new Held(lease, null));
        return object().<ObjectNode>set("fence", fence(lease.fence())).put("token", lease.token());
    }

    private JsonNode holdAll(JsonNode request) {
        HoldOptions options = HoldOptions.defaults().ttl(millis(request, "ttl_ms"));
        options = request.hasNonNull("wait_ms") ? options.waitFor(millis(request, "wait_ms")) : options.noWait();
        List<String> resources = new ArrayList<>();
        for (JsonNode resource : request.path("resources")) {
            resources.add(resource.asText());
        }
        SetLease set = locks.holdAll(resources, options);
        keep(text(request, "lease"), new Held(null, set));
        ArrayNode fences = NODES.arrayNode();
        set.fences().forEach(fence -> fences.add(fence(fence)));
        return object().<ObjectNode>set("fences", fences).put("token", set.token());
    }

    private JsonNode campaign(JsonNode request) {
        HoldOptions options = HoldOptions.defaults().ttl(millis(request, "ttl_ms"));
        options = request.hasNonNull("wait_ms") ? options.waitFor(millis(request, "wait_ms")) : options.waitForever();
        Lease lease = locks.campaign(text(request, "name"), text(request, "address"), options);
        keep(text(request, "lease"), new Held(lease, null));
        return object().set("fence", fence(lease.fence()));
    }

    /** Names the lease and reports its loss the moment the client knows it. */
    private void keep(String name, Held held) {
        leases.put(name, held);
        held.whenLost().thenAccept(loss -> reportLoss(name, held));
    }

    /** The {@code lost} event, once per lease, as soon as the lease says it is lost. */
    private void reportLoss(String name, Held held) {
        Optional<LossReason> reason = held.lostReason();
        if (reason.isPresent() && held.lossReported.compareAndSet(false, true)) {
            write(object().put("event", "lost").put("lease", name).put("reason", reason.get().wireName()));
        }
    }

    private Held held(JsonNode request) {
        String name = text(request, "lease");
        Held held = leases.get(name);
        if (held == null) {
            throw new Usage("no lease named " + name);
        }
        return held;
    }

    private JsonNode release(JsonNode request) {
        Held held = held(request);
        if (!held.ended.compareAndSet(false, true)) {
            return object().put("released", false); // released before, or its run ended it
        }
        boolean released;
        try {
            held.release();
            released = true;
        } catch (LeaseLostException | NotReleasedException e) {
            released = false;
        }
        reportLoss(text(request, "lease"), held);
        return object().put("released", released);
    }

    private JsonNode run(JsonNode request) throws Exception {
        Held held = held(request);
        String name = text(request, "lease");
        if (!held.ended.compareAndSet(false, true)) {
            throw new Ended(name, held.lostReason());
        }
        long workMs = request.path("work_ms").asLong(0);
        boolean fail = request.path("fail").asBoolean(false);
        try {
            held.run(() -> {
                try {
                    Thread.sleep(workMs);
                } catch (InterruptedException e) {
                    if (!fail) {
                        throw e; // stopped by the loss: the loss is the outcome
                    }
                }
                if (fail) {
                    throw new WorkFailed();
                }
                return null;
            });
        } finally {
            reportLoss(name, held); // before the reply that may report the same loss
        }
        return object().put("output", "done");
    }

    private JsonNode fenced(JsonNode request) {
        Held held = held(request);
        List<String> command = new ArrayList<>();
        for (JsonNode arg : request.path("command")) {
            command.add(arg.asText());
        }
        if (command.isEmpty()) {
            throw new Usage("fenced needs a command");
        }
        Object reply = held.fenced(optionalText(request, "resource", null), command.toArray(String[]::new));
        return object().set("reply", encode(reply));
    }

    private JsonNode observe(JsonNode request) {
        String name = text(request, "name");
        locks.observe(name, leader -> write(object().put("event", "leader").put("name", name)
                .set("leader", leader.map(Driver::leader).orElse(NODES.nullNode()))));
        return object();
    }

    private static JsonNode leader(Leader leader) {
        ObjectNode shown = object().put("token", leader.token());
        shown.set("fence", fence(leader.fence()));
        return shown.put("address", leader.address());
    }

    /** An inner command's reply as JSON: null, numbers, text, arrays, and {"map": [[k, v], ...]} for a RESP3 map. */
    static JsonNode encode(Object reply) {
        if (reply == null) {
            return NODES.nullNode();
        }
        if (reply instanceof Long n) {
            return NODES.numberNode(n);
        }
        if (reply instanceof BigInteger n) {
            return NODES.numberNode(n);
        }
        if (reply instanceof Double n) {
            return NODES.numberNode(n);
        }
        if (reply instanceof Boolean b) {
            return NODES.booleanNode(b);
        }
        if (reply instanceof List<?> list) {
            ArrayNode array = NODES.arrayNode();
            list.forEach(item -> array.add(encode(item)));
            return array;
        }
        if (reply instanceof Map<?, ?> map) {
            ArrayNode pairs = NODES.arrayNode();
            map.forEach((key, value) -> pairs.add(NODES.arrayNode().add(encode(key)).add(encode(value))));
            return object().set("map", pairs);
        }
        return NODES.textNode(reply.toString());
    }

    /** A fence (an unsigned 64-bit number) as a JSON number. */
    private static JsonNode fence(long fence) {
        return fence >= 0 ? NODES.numberNode(fence) : NODES.numberNode(new BigInteger(Long.toUnsignedString(fence)));
    }

    /** An error reply's body: its kind (docs/protocol.md, section 14) and details. */
    static ObjectNode describe(Throwable e) {
        ObjectNode error = object();
        if (e instanceof WorkFailed) {
            error.put("kind", "work");
        } else if (e instanceof Usage || e instanceof IllegalArgumentException) {
            error.put("kind", "usage");
        } else if (e instanceof NotAcquiredException acquire) {
            error.put("kind", acquire.outcome().wireName());
            if (acquire.outcome() == NotAcquiredException.Outcome.UNKNOWN) {
                error.put("token", acquire.token()).put("released", acquire.released());
            }
        } else if (e instanceof Ended ended) {
            error.put("kind", "lost");
            ended.reason.ifPresent(reason -> error.put("reason", reason.wireName()));
        } else if (e instanceof LeaseLostException lost) {
            error.put("kind", "lost").put("reason", lost.reason().wireName());
        } else if (e instanceof NotReleasedException) {
            error.put("kind", "not_released");
        } else if (e instanceof StaleFenceException) {
            error.put("kind", "stale");
        } else if (e instanceof ServerErrorException server) {
            error.put("kind", server.errorClass().wireName());
        } else if (e instanceof dev.dlock.DlockException) {
            error.put("kind", "unknown"); // a request that failed without a server's reply
        } else {
            error.put("kind", "server").put("detail", "driver: " + e);
            return error;
        }
        return error.put("detail", String.valueOf(e.getMessage()));
    }

    private static String text(JsonNode request, String field) {
        JsonNode value = request.get(field);
        if (value == null || value.isNull()) {
            throw new Usage("missing " + field);
        }
        return value.asText();
    }

    private static String optionalText(JsonNode request, String field, String otherwise) {
        return request.hasNonNull(field) ? request.get(field).asText() : otherwise;
    }

    private static Duration millis(JsonNode request, String field) {
        JsonNode value = request.get(field);
        if (value == null || !value.canConvertToLong()) {
            throw new Usage("missing or not a number of milliseconds: " + field);
        }
        return Duration.ofMillis(value.asLong());
    }
}
