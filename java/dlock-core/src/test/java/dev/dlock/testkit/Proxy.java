package dev.dlock.testkit;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * A TCP proxy on a loopback port to a server, which can lose a reply: the next bytes the server
 * sends are dropped and that connection is closed, as a network that fails after the request
 * arrived and before its answer came back. It can also rewrite byte strings (an older server) and
 * hold replies back for a while (a slow way back).
 */
public final class Proxy implements AutoCloseable {
    private final ServerSocket listener;
    private final int target;
    private final AtomicBoolean dropNextReply = new AtomicBoolean();
    private volatile long holdNewMillis; // new connections forward nothing for this long
    private final List<Socket> sockets = new CopyOnWriteArrayList<>();
    /** Byte strings replaced by others of the same length: [0] in requests, [1] in replies. */
    private final List<List<byte[][]>> rewrites = List.of(new CopyOnWriteArrayList<>(), new CopyOnWriteArrayList<>());
    private volatile long delayRepliesMillis; // every reply read from now on is forwarded this much later
    private final java.util.concurrent.atomic.AtomicInteger[] rewritten = {
        new java.util.concurrent.atomic.AtomicInteger(), new java.util.concurrent.atomic.AtomicInteger()};

    public Proxy(int target) throws IOException {
        this.target = target;
        this.listener = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
        Thread accept = new Thread(this::accept, "proxy-accept");
        accept.setDaemon(true);
        accept.start();
    }

    public String url() {
        return "redis://127.0.0.1:" + listener.getLocalPort();
    }

    /** The next reply the server sends on any connection is lost, and its connection closed. */
    public void dropNextReply() {
        dropNextReply.set(true);
    }

    /**
     * Connections opened from now on forward nothing, either way, for {@code hold} (a server slow
     * to answer a new connection; a long hold: one that never answers). Open ones are unaffected.
     */
    public void holdNewConnections(java.time.Duration hold) {
        holdNewMillis = hold.toMillis();
    }

    /**
     * From now on, every {@code from} in what clients send ({@code replies} false) or in what the
     * server answers ({@code replies} true) becomes {@code to}, of the same length. With both
     * directions a test plays an older server: a new option renamed on its way in, the server's
     * complaint about the new name renamed back on its way out. A string split between two reads
     * is not seen (small requests on loopback are read whole).
     */
    public void rewrite(boolean replies, String from, String to) {
        if (from.length() != to.length()) {
            throw new IllegalArgumentException("a rewrite keeps the length");
        }
        rewrites.get(replies ? 1 : 0).add(new byte[][] {from.getBytes(java.nio.charset.StandardCharsets.UTF_8),
                to.getBytes(java.nio.charset.StandardCharsets.UTF_8)});
    }

    /** How many byte strings were rewritten so far in requests ({@code replies} false) or in replies. */
    public int rewritten(boolean replies) {
        return rewritten[replies ? 1 : 0].get();
    }

    /** Every reply (and pub/sub message) read from now on reaches the client {@code delay} later. */
    public void delayReplies(java.time.Duration delay) {
        delayRepliesMillis = delay.toMillis();
    }

    /** Replaces every {@code old} in the first n bytes of data by {@code replacement} (of the same length); how many. */
    private static int replaceAll(byte[] data, int n, byte[] old, byte[] replacement) {
        int count = 0;
        for (int at = 0; at + old.length <= n; at++) {
            if (java.util.Arrays.equals(data, at, at + old.length, old, 0, old.length)) {
                System.arraycopy(replacement, 0, data, at, old.length);
                at += old.length - 1;
                count++;
            }
        }
        return count;
    }

    private void accept() {
        while (!listener.isClosed()) {
            try {
                Socket client = listener.accept();
                Socket server = new Socket(InetAddress.getLoopbackAddress(), target);
                sockets.add(client);
                sockets.add(server);
                long hold = holdNewMillis;
                pump(client, server, false, hold);
                pump(server, client, true, hold);
            } catch (IOException e) {
                return;
            }
        }
    }

    private void pump(Socket from, Socket to, boolean replies, long holdMillis) {
        Thread thread = new Thread(() -> {
            byte[] buffer = new byte[16384];
            try {
                Thread.sleep(holdMillis);
            } catch (InterruptedException e) {
                return;
            }
            try (InputStream in = from.getInputStream(); OutputStream out = to.getOutputStream()) {
                int n;
                while ((n = in.read(buffer)) > 0) {
                    if (replies && dropNextReply.compareAndSet(true, false)) {
                        break;
                    }
                    for (byte[][] rewrite : rewrites.get(replies ? 1 : 0)) {
                        rewritten[replies ? 1 : 0].addAndGet(replaceAll(buffer, n, rewrite[0], rewrite[1]));
                    }
                    long delay = delayRepliesMillis;
                    if (replies && delay > 0) {
                        Thread.sleep(delay);
                    }
                    out.write(buffer, 0, n);
                    out.flush();
                }
            } catch (IOException e) {
                // closed
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            } finally {
                closeQuietly(from);
                closeQuietly(to);
            }
        }, "proxy-pump");
        thread.setDaemon(true);
        thread.start();
    }

    private static void closeQuietly(Socket socket) {
        try {
            socket.close();
        } catch (IOException e) {
            // already closed
        }
    }

    @Override
    public void close() throws IOException {
        listener.close();
        sockets.forEach(Proxy::closeQuietly);
    }
}
