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
 * arrived and before its answer came back.
 */
public final class Proxy implements AutoCloseable {
    private final ServerSocket listener;
    private final int target;
    private final AtomicBoolean dropNextReply = new AtomicBoolean();
    private volatile long holdNewMillis; // new connections forward nothing for this long
    private final List<Socket> sockets = new CopyOnWriteArrayList<>();

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
                    out.write(buffer, 0, n);
                    out.flush();
                }
            } catch (IOException e) {
                // closed
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
