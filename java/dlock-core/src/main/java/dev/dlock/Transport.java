package dev.dlock;

import io.lettuce.core.ClientOptions;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.RedisConnectionException;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.cluster.RedisClusterClient;
import io.lettuce.core.cluster.api.StatefulRedisClusterConnection;
import io.lettuce.core.cluster.models.partitions.RedisClusterNode;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.ProtocolKeyword;
import java.net.ConnectException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * The connections dlock uses: one shared, multiplexed connection for short requests (Lettuce's,
 * which in a cluster routes by the resource's slot and follows MOVED and ASK), a connection of its
 * own per blocking wait and per release of an unknown grant (opened to the resource's primary,
 * with the caller's credentials and TLS, and a command timeout above the wait), and one pub/sub
 * connection per server for the resources' channels.
 */
final class Transport implements AutoCloseable {
    private final RedisClient single;
    private final RedisURI uri; // a single server's, or a cluster seed's (its credentials and TLS)
    private final RedisClusterClient cluster;
    private final RedisClient nodes; // for connections of our own to a cluster's nodes
    private final RedisClient once; // at-most-once connections (autoReconnect off) for DLOCK.FENCED
    private final boolean owned;

    private StatefulRedisConnection<String, String> singleShared;
    private StatefulRedisClusterConnection<String, String> clusterShared;
    private final Map<String, StatefulRedisConnection<String, String>> onceConnections = new HashMap<>();
    private final Map<String, Channels> channels = new HashMap<>();

    Transport(RedisClient single, RedisURI uri, boolean owned) {
        this.single = single;
        this.uri = uri;
        this.cluster = null;
        this.nodes = null;
        this.once = atMostOnce(single.getResources(), single.getOptions());
        this.owned = owned;
    }

    Transport(RedisClusterClient cluster, RedisURI seed, boolean owned) {
        this.single = null;
        this.uri = seed;
        this.cluster = cluster;
        this.nodes = RedisClient.create(cluster.getResources());
        // The caller's options (TLS, protocol, timeouts, reconnection) for our own node connections too.
        this.nodes.setOptions(ClientOptions.copyOf(cluster.getOptions()));
        this.once = atMostOnce(cluster.getResources(), cluster.getOptions());
        this.owned = owned;
    }

    /**
     * A client for connections that never send a command twice: with Lettuce's auto-reconnect on
     * (the default), a command in flight when the connection drops is sent again on the new one
     * (at-least-once); with it off, it fails instead (at-most-once). The caller's other options
     * (TLS, protocol, timeouts) are kept.
     */
    private static RedisClient atMostOnce(io.lettuce.core.resource.ClientResources resources, ClientOptions options) {
        RedisClient client = RedisClient.create(resources);
        client.setOptions(ClientOptions.copyOf(options).mutate().autoReconnect(false).build());
        return client;
    }

    boolean isCluster() {
        return cluster != null;
    }

    /** A command name Lettuce sends as it is. */
    private static final class Keyword implements ProtocolKeyword {
        private final String command;

        Keyword(String command) {
            this.command = command;
        }

        @Override
        public byte[] getBytes() {
            return command.getBytes(StandardCharsets.US_ASCII);
        }

        @Override
        public String toString() {
            return command;
        }
    }

    private static CommandArgs<String, String> commandArgs(List<String> args) {
        CommandArgs<String, String> out = new CommandArgs<>(StringCodec.UTF8);
        int keys = 1;
        int first = 1;
        if (Protocol.onSet(args)) {
            // numkeys, then the set's members: a cluster connection routes by the first one's slot
            // (every member is in it).
            out.add(args.get(1));
            keys = Integer.parseInt(args.get(1));
            first = 2;
        }
        // The resource is the key: a cluster connection routes by its slot.
        for (String key : args.subList(first, first + keys)) {
            out.addKey(key);
        }
        for (String arg : args.subList(first + keys, args.size())) {
            out.add(arg);
        }
        return out;
    }

    /** Sends args on the shared connection; the future fails with a TimeoutException after timeout. */
    CompletableFuture<Object> send(List<String> args, Duration timeout) {
        CompletableFuture<Object> reply;
        try {
            if (cluster != null) {
                reply = clusterShared().async().dispatch(new Keyword(args.get(0)), new ReplyOutput(), commandArgs(args))
                        .toCompletableFuture();
            } else {
                reply = singleShared().async().dispatch(new Keyword(args.get(0)), new ReplyOutput(), commandArgs(args))
                        .toCompletableFuture();
            }
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
        return reply.orTimeout(timeout.toMillis(), TimeUnit.MILLISECONDS);
    }

    /**
     * Sends args at most once (DLOCK.FENCED: a write sent again after a lost reply could run twice),
     * on a connection to the resource's primary that never replays a command after a reconnection;
     * a dropped connection fails the call and is opened again for the next. In a cluster a MOVED
     * (nothing ran) is followed to the node it names (the slot map is read again too: a node asked
     * for it right after a slot moved may still name the old owner), an ASK with ASKING, at most 5
     * times.
     */
    Object callOnce(String resource, List<String> args, Duration timeout) throws Exception {
        RedisURI target = nodeUri(resource);
        for (int redirects = 0; ; redirects++) {
            try {
                StatefulRedisConnection<String, String> connection = onceConnection(target);
                return await(connection.async().dispatch(new Keyword(args.get(0)), new ReplyOutput(), commandArgs(args))
                        .toCompletableFuture().orTimeout(timeout.toMillis(), TimeUnit.MILLISECONDS));
            } catch (Exception e) {
                String reply = errorReply(e);
                if (cluster == null || reply == null || redirects >= 5
                        || Protocol.errorClass(reply) != ErrorClass.REDIRECT) {
                    throw e;
                }
                if (reply.startsWith("ASK ")) {
                    return askOnce(reply, args, timeout);
                }
                cluster.refreshPartitions();
                target = redirectTarget(reply);
            }
        }
    }

    /** The node a MOVED or ASK reply names ({@code MOVED <slot> <host>:<port>}). */
    private RedisURI redirectTarget(String reply) {
        String[] words = reply.split(" ");
        String address = words[words.length - 1];
        int colon = address.lastIndexOf(':');
        return withCredentials(address.substring(0, colon), Integer.parseInt(address.substring(colon + 1)));
    }

    private Object askOnce(String reply, List<String> args, Duration timeout) throws Exception {
        RedisURI target = redirectTarget(reply);
        StatefulRedisConnection<String, String> connection = open(once.connectAsync(StringCodec.UTF8, target), target);
        try {
            connection.async().asking();
            return await(connection.async().dispatch(new Keyword(args.get(0)), new ReplyOutput(), commandArgs(args))
                    .toCompletableFuture().orTimeout(timeout.toMillis(), TimeUnit.MILLISECONDS));
        } finally {
            connection.closeAsync();
        }
    }

    private synchronized StatefulRedisConnection<String, String> onceConnection(RedisURI at) {
        String key = at.getHost() + ":" + at.getPort();
        StatefulRedisConnection<String, String> connection = onceConnections.get(key);
        if (connection == null || !connection.isOpen()) {
            if (connection != null) {
                connection.closeAsync();
            }
            connection = open(once.connectAsync(StringCodec.UTF8, at), at);
            onceConnections.put(key, connection);
        }
        return connection;
    }

    /** Sends args on the shared connection and waits for the reply. */
    Object call(List<String> args, Duration timeout) throws Exception {
        return await(send(args, timeout));
    }

    static Object await(CompletableFuture<Object> future) throws Exception {
        try {
            return future.get();
        } catch (ExecutionException e) {
            Throwable cause = e.getCause();
            if (cause instanceof Exception failure) {
                throw failure;
            }
            throw e;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw e;
        }
    }

    /**
     * Sends args on a connection opened for it to the resource's primary, closed after the reply
     * or the timeout (a server drops a blocked waiter whose connection closes). The connection's
     * own command timeout is above ours; it opens within the URI's connect timeout ({@link #open}),
     * and {@code timeout} counts from then.
     */
    Object alone(String resource, List<String> args, Duration timeout) throws Exception {
        StatefulRedisConnection<String, String> connection = connectTo(resource);
        try {
            connection.setTimeout(timeout.plusSeconds(1));
            CompletableFuture<Object> reply = connection.async()
                    .dispatch(new Keyword(args.get(0)), new ReplyOutput(), commandArgs(args))
                    .toCompletableFuture().orTimeout(timeout.toMillis(), TimeUnit.MILLISECONDS);
            return await(reply);
        } finally {
            connection.closeAsync();
        }
    }

    private StatefulRedisConnection<String, String> connectTo(String resource) {
        if (cluster == null) {
            return open(single.connectAsync(StringCodec.UTF8, uri), uri);
        }
        RedisURI at = nodeUri(resource);
        return open(nodes.connectAsync(StringCodec.UTF8, at), at);
    }

    /**
     * Waits for a connection of dlock's own (a wait's, a release's, a fenced write's, the channels')
     * to open, at most the connect timeout of {@code at}: its RedisURI's timeout, which also bounds
     * Lettuce's handshake on it. Never the request timeout: a request's time starts once its
     * connection is open. A connection that opens after the deadline is closed.
     *
     * @throws RedisConnectionException if it did not open in time (nothing was sent on it)
     */
    static <C extends io.lettuce.core.api.StatefulConnection<?, ?>> C open(java.util.concurrent.CompletionStage<C> opening,
            RedisURI at) {
        CompletableFuture<C> future = opening.toCompletableFuture();
        Duration timeout = connectTimeout(at);
        try {
            return future.get(timeout.toNanos(), TimeUnit.NANOSECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            future.thenAccept(io.lettuce.core.api.StatefulConnection::closeAsync);
            throw new RedisConnectionException("dlock: interrupted while connecting to " + at.getHost() + ":" + at.getPort(), e);
        } catch (TimeoutException e) {
            future.thenAccept(io.lettuce.core.api.StatefulConnection::closeAsync);
            throw new RedisConnectionException("dlock: no connection to " + at.getHost() + ":" + at.getPort() + " within "
                    + timeout.toMillis() + " ms (the RedisURI's timeout)");
        } catch (ExecutionException e) {
            Throwable cause = unwrap(e);
            if (cause instanceof RedisConnectionException connection) {
                throw connection;
            }
            throw new RedisConnectionException("dlock: cannot connect to " + at.getHost() + ":" + at.getPort() + ": " + cause, cause);
        }
    }

    /** The time a connection of dlock's own to {@code at} may take to open: its RedisURI's timeout. */
    static Duration connectTimeout(RedisURI at) {
        return at.getTimeout();
    }

    /** The URI of the primary serving the resource's slot, with the seed's credentials and TLS. */
    RedisURI nodeUri(String resource) {
        if (cluster == null) {
            return uri;
        }
        RedisClusterNode node = cluster.getPartitions().getMasterBySlot(Protocol.keySlot(resource));
        if (node == null) {
            cluster.refreshPartitions();
            node = cluster.getPartitions().getMasterBySlot(Protocol.keySlot(resource));
        }
        if (node == null) {
            throw new RedisConnectionException("no node serves the slot of " + resource);
        }
        return withCredentials(node.getUri().getHost(), node.getUri().getPort());
    }

    /** A node's URI with the seed's credentials and TLS. */
    private RedisURI withCredentials(String host, int port) {
        RedisURI copy = new RedisURI(host, port, uri.getTimeout());
        copy.setCredentialsProvider(uri.getCredentialsProvider());
        copy.setSsl(uri.isSsl());
        copy.setVerifyPeer(uri.getVerifyMode());
        copy.setStartTls(uri.isStartTls());
        return copy;
    }

    /** After a MOVED seen on a connection of our own: read the slot map again. */
    void refreshSlots() {
        if (cluster != null) {
            cluster.refreshPartitions();
        }
    }

    /** The pub/sub connection of the server serving resource (made on first use). */
    synchronized Channels channels(String resource) {
        RedisURI at = nodeUri(resource);
        String key = at.getHost() + ":" + at.getPort();
        return channels.computeIfAbsent(key, k -> new Channels(cluster != null ? nodes : single, at, cluster != null,
                cluster != null ? this::channelsAfterMove : null));
    }

    /** The channels of the primary serving resource's slot, after reading the slot map again (its slot moved). */
    private Channels channelsAfterMove(String resource) {
        refreshSlots();
        return channels(resource);
    }

    private synchronized StatefulRedisConnection<String, String> singleShared() {
        if (singleShared == null) {
            singleShared = single.connect(StringCodec.UTF8, uri);
        }
        return singleShared;
    }

    private synchronized StatefulRedisClusterConnection<String, String> clusterShared() {
        if (clusterShared == null) {
            clusterShared = cluster.connect(StringCodec.UTF8);
        }
        return clusterShared;
    }

    /** The text of a server's error reply, or null for any other failure. */
    static String errorReply(Throwable failure) {
        Throwable cause = unwrap(failure);
        if (cause instanceof RedisCommandExecutionException) {
            return cause.getMessage();
        }
        return null;
    }

    /** A failure after which the request surely did not reach a server (no connection could be made). */
    static boolean notSent(Throwable failure) {
        Throwable cause = unwrap(failure);
        if (cause instanceof RedisConnectionException) {
            return true;
        }
        for (Throwable c = cause; c != null; c = c.getCause()) {
            if (c instanceof ConnectException) {
                return true;
            }
        }
        return false;
    }

    static boolean timedOut(Throwable failure) {
        Throwable cause = unwrap(failure);
        return cause instanceof TimeoutException || cause instanceof io.lettuce.core.RedisCommandTimeoutException;
    }

    static Throwable unwrap(Throwable failure) {
        Throwable cause = failure;
        while ((cause instanceof CompletionException || cause instanceof ExecutionException) && cause.getCause() != null) {
            cause = cause.getCause();
        }
        return cause;
    }

    @Override
    public synchronized void close() {
        channels.values().forEach(Channels::close);
        channels.clear();
        if (singleShared != null) {
            singleShared.close();
        }
        if (clusterShared != null) {
            clusterShared.close();
        }
        onceConnections.values().forEach(StatefulRedisConnection::closeAsync);
        onceConnections.clear();
        once.shutdown(Duration.ZERO, Duration.ofSeconds(2));
        if (nodes != null) {
            nodes.shutdown(Duration.ZERO, Duration.ofSeconds(2));
        }
        if (owned) {
            if (single != null) {
                single.shutdown(Duration.ZERO, Duration.ofSeconds(2));
            }
            if (cluster != null) {
                cluster.shutdown(Duration.ZERO, Duration.ofSeconds(2));
            }
        }
    }
}
