package dev.dlock;

import java.math.BigInteger;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;

/**
 * dlock's wire rules, written once for this client: channel names, the hand-over tag, channel
 * messages, key slots, the argument vector of every command form, error classes and reading
 * {@code DLOCK.INFO}. No I/O here. {@code protocol/vectors/*.json} in the repository pins every
 * rule (the unit tests load them); {@code docs/protocol.md} is the contract in prose.
 */
public final class Protocol {
    /** The server's bound on a semaphore's permits ({@code SHARED LIMIT n}). */
    public static final int MAX_PERMITS = 1_000_000;

    static final String ACQUIRE = "DLOCK.ACQUIRE";
    static final String RENEW = "DLOCK.RENEW";
    static final String RELEASE = "DLOCK.RELEASE";
    static final String FENCECHECK = "DLOCK.FENCECHECK";
    static final String FENCED = "DLOCK.FENCED";
    static final String INFO = "DLOCK.INFO";
    static final String ACQUIREALL = "DLOCK.ACQUIREALL";
    static final String RENEWALL = "DLOCK.RENEWALL";
    static final String RELEASEALL = "DLOCK.RELEASEALL";

    /** The most resources in one set ({@code DLOCK.ACQUIREALL}, {@code RENEWALL}, {@code RELEASEALL}). */
    public static final int MAX_SET = 64;
    /** A set's ticket lives as long as its wait, at least this (milliseconds)... */
    static final long SET_TICKET_MIN_MS = 1_000;
    /** ... and at most this, which is also the ticket of a wait without limit. */
    static final long SET_TICKET_MAX_MS = 30_000;

    private static final List<String> OPTION_KEYWORDS =
            List.of("CLAIM", "FENCE", "LIMIT", "META", "NOTIFY", "QUEUE", "SHARED", "WAIT");
    private static final String UNEXPECTED_ARGUMENT = "ERR syntax error: unexpected argument '";
    private static final BigInteger TWO_TO_64 = BigInteger.ONE.shiftLeft(64);

    private Protocol() {}

    /**
     * The channel where the server publishes the resource's changes of ownership: a resource with
     * braces keeps them, and its hash tag, behind {@code dlock:key:}; any other is wrapped in a tag
     * ({@code invoice:7} gives {@code dlock:{invoice:7}}), so the channel lives in the key's slot.
     *
     * @param resource the lock's key
     * @return the channel name
     */
    public static String channelName(String resource) {
        if (resource.indexOf('{') >= 0 || resource.indexOf('}') >= 0) {
            return "dlock:key:" + resource;
        }
        return "dlock:{" + resource + "}";
    }

    /**
     * The tag a {@code handoff} message names its new holder by: FNV-1a 32-bit of the token's UTF-8
     * bytes, as 8 lowercase hex digits.
     *
     * @param token a lease's token
     * @return the tag
     */
    public static String tokenTag(String token) {
        int tag = 0x811c9dc5;
        for (byte b : token.getBytes(java.nio.charset.StandardCharsets.UTF_8)) {
            tag ^= b & 0xff;
            tag *= 0x01000193;
        }
        return String.format(Locale.ROOT, "%08x", tag);
    }

    /**
     * What a ticket's own channel is named by: FNV-1a 64-bit of the token's UTF-8 bytes, as 16
     * lowercase hex digits (wide enough that two random tokens waiting at once never share it).
     *
     * @param token a ticket's token
     * @return the wide tag
     */
    public static String wideTag(String token) {
        long tag = 0xcbf29ce484222325L;
        for (byte b : token.getBytes(java.nio.charset.StandardCharsets.UTF_8)) {
            tag ^= b & 0xff;
            tag *= 0x100000001b3L;
        }
        return String.format(Locale.ROOT, "%016x", tag);
    }

    /**
     * The channel where the server tells the ticket of {@code token} on {@code resource} (an
     * ACQUIRE sent with {@code NOTIFY}) alone of its grant: the resource's channel, {@code :} and
     * the token's {@linkplain #wideTag(String) wide tag} ({@code dlock:{invoice:123}:af63dc4c8601ec8c}
     * for token {@code a}), in the resource's slot.
     *
     * @param resource the lock's key
     * @param token the ticket's token
     * @return the channel name
     */
    public static String ticketChannelName(String resource, String token) {
        return channelName(resource) + ":" + wideTag(token);
    }

    /**
     * A {@code granted <fence> <request> <window-ms>} message on a ticket's own channel: the lease
     * of {@code fence} was handed to the ticket after the server read its ACQUIRE numbered
     * {@code request} ({@code NOTIFY}), and runs {@code windowMs} from the hand-over unless
     * claimed. Each is an unsigned 64-bit number held in a long.
     *
     * @param fence the lease's fence
     * @param request the {@code NOTIFY} number of the ticket's latest ACQUIRE the server read
     * @param windowMs how long the lease runs from the hand-over unless claimed
     */
    public record Granted(long fence, long request, long windowMs) {}

    /**
     * Reads a {@code granted} message of a ticket's own channel: exactly four words, the last
     * three decimal numbers below 2^64.
     *
     * @param message the published message
     * @return what it says, or empty for any other text
     */
    public static Optional<Granted> granted(String message) {
        String[] words = message.split(" ", -1);
        if (words.length != 4 || !words[0].equals("granted")) {
            return Optional.empty();
        }
        long[] numbers = new long[3];
        for (int i = 0; i < 3; i++) {
            String digits = words[i + 1];
            if (digits.isEmpty() || !digits.chars().allMatch(c -> c >= '0' && c <= '9')) {
                return Optional.empty();
            }
            try {
                numbers[i] = Long.parseUnsignedLong(digits);
            } catch (NumberFormatException e) {
                return Optional.empty(); // past 2^64 - 1
            }
        }
        return Optional.of(new Granted(numbers[0], numbers[1], numbers[2]));
    }

    /**
     * The earliest the lease a {@code granted} message announces may end: the send time of the
     * ACQUIRE it names ({@code sentAt}: each ACQUIRE's send time, the one numbered {@code n} at
     * index {@code n - 1}) plus the window (that request reached the server before the
     * hand-over). Times are in units of {@code unitsPerMs} per millisecond (1_000_000 for
     * {@link System#nanoTime()}); a window too long to add is cut to a quarter of the clock's
     * range (a lease that long outlives any wait).
     *
     * @param message the {@code granted} message
     * @param sentAt each ACQUIRE's send time, in the order of their numbers
     * @param unitsPerMs the clock's units per millisecond
     * @return the expiry, or empty when the request is not one of the attempt's
     */
    static java.util.OptionalLong grantedExpiry(Granted message, List<Long> sentAt, long unitsPerMs) {
        long request = message.request();
        if (request < 1 || request > sentAt.size()) {
            return java.util.OptionalLong.empty(); // 0, past the attempt's or above 2^63 - 1
        }
        long longest = Long.MAX_VALUE / 4 / unitsPerMs;
        long windowMs = Long.compareUnsigned(message.windowMs(), longest) > 0 ? longest : message.windowMs();
        return java.util.OptionalLong.of(sentAt.get((int) (request - 1)) + windowMs * unitsPerMs);
    }

    /**
     * Whether a channel message wakes a watcher: an observer ({@code tag} null) is woken by every
     * message; a ticket waiter by a hand-over to its token, a hand-over without a tag (an older
     * server) and any message this version does not understand, never by {@code acquired},
     * {@code renewed}, {@code released} or {@code expired}.
     *
     * @param message the published message
     * @param tag the waiter's tag, or null for an observer
     * @return whether the watcher should look again
     */
    public static boolean wakes(String message, String tag) {
        if (tag == null) {
            return true;
        }
        String[] words = message.split(" ", -1);
        if (words.length == 2 && List.of("acquired", "renewed", "released", "expired").contains(words[0])) {
            return false;
        }
        if (words.length == 3 && words[0].equals("handoff")) {
            return words[2].equals(tag);
        }
        return true;
    }

    /**
     * What a {@code revoked} channel message says: the revoked lease's fence and the reason the
     * operator gave {@code DLOCK.REVOKE}.
     *
     * @param fence the revoked lease's fence (an unsigned 64-bit number)
     * @param reason the rest of the message after the fence and its space, spaces included; empty
     *     when no reason was given
     */
    public record Revocation(long fence, String reason) {}

    /**
     * Reads a channel message that {@code DLOCK.REVOKE} published: {@code revoked <fence>} and,
     * when the operator gave one, a space and the reason.
     *
     * @param message the published message
     * @return the revocation, or empty for any other message
     */
    public static Optional<Revocation> revocation(String message) {
        String prefix = "revoked ";
        if (!message.startsWith(prefix)) {
            return Optional.empty();
        }
        int space = message.indexOf(' ', prefix.length());
        String digits = space < 0 ? message.substring(prefix.length()) : message.substring(prefix.length(), space);
        if (digits.isEmpty() || !digits.chars().allMatch(c -> c >= '0' && c <= '9')) {
            return Optional.empty();
        }
        long fence;
        try {
            fence = Long.parseUnsignedLong(digits);
        } catch (NumberFormatException e) {
            return Optional.empty(); // past 2^64 - 1
        }
        return Optional.of(new Revocation(fence, space < 0 ? "" : message.substring(space + 1)));
    }

    /**
     * The Redis Cluster slot of a key: CRC16/XMODEM of its hash tag (the text between the first
     * "{" and the next "}", if not empty) or of the whole key, modulo 16384.
     *
     * @param key a key
     * @return its slot, 0 to 16383
     */
    public static int keySlot(String key) {
        byte[] bytes = key.getBytes(java.nio.charset.StandardCharsets.UTF_8);
        int start = 0;
        int end = bytes.length;
        for (int open = 0; open < bytes.length; open++) {
            if (bytes[open] == '{') {
                for (int close = open + 1; close < bytes.length; close++) {
                    if (bytes[close] == '}') {
                        if (close > open + 1) {
                            start = open + 1;
                            end = close;
                        }
                        break;
                    }
                }
                break;
            }
        }
        int crc = 0;
        for (int i = start; i < end; i++) {
            crc ^= (bytes[i] & 0xff) << 8;
            for (int bit = 0; bit < 8; bit++) {
                crc = (crc & 0x8000) != 0 ? (crc << 1) ^ 0x1021 : crc << 1;
                crc &= 0xffff;
            }
        }
        return crc % 16384;
    }

    /**
     * One {@code DLOCK.ACQUIRE} as sent.
     *
     * @param resource the lock's key
     * @param token the attempt's token
     * @param ttlMs the lease's length
     * @param shared a reader or a permit of a semaphore
     * @param permits with shared: the semaphore's size; 0 for a reader
     * @param waitMs a blocking wait ({@code WAIT}; 0 is no limit), or null for none
     * @param queueMs a ticket's length ({@code QUEUE}), or 0 for none
     * @param claimMs the claim window, or 0 for none (sent only with a wait or a ticket, never
     *     above the ttl)
     * @param meta what the holder says of itself ({@code META}), or null
     * @param notifyRequest with a ticket: the ACQUIRE's number within its wait ({@code NOTIFY}), so
     *     that the server tells the ticket alone of its grant on its own channel; null for none
     *     (sent only with a ticket)
     */
    public record AcquireForm(String resource, String token, long ttlMs, boolean shared, int permits,
            Long waitMs, long queueMs, long claimMs, String meta, Long notifyRequest) {
        /**
         * One {@code DLOCK.ACQUIRE} without {@code NOTIFY}.
         *
         * @param resource the lock's key
         * @param token the attempt's token
         * @param ttlMs the lease's length
         * @param shared a reader or a permit of a semaphore
         * @param permits with shared: the semaphore's size; 0 for a reader
         * @param waitMs a blocking wait ({@code WAIT}; 0 is no limit), or null for none
         * @param queueMs a ticket's length ({@code QUEUE}), or 0 for none
         * @param claimMs the claim window, or 0 for none
         * @param meta what the holder says of itself ({@code META}), or null
         */
        public AcquireForm(String resource, String token, long ttlMs, boolean shared, int permits,
                Long waitMs, long queueMs, long claimMs, String meta) {
            this(resource, token, ttlMs, shared, permits, waitMs, queueMs, claimMs, meta, null);
        }

        /**
         * The argument vector: {@code DLOCK.ACQUIRE resource token ttl-ms [SHARED [LIMIT n]]
         * [WAIT ms | QUEUE ms [NOTIFY request]] [CLAIM ms] [META value]}.
         *
         * @return the command and its arguments
         */
        public List<String> args() {
            List<String> args = new ArrayList<>(List.of(ACQUIRE, resource, token, Long.toString(ttlMs)));
            if (shared) {
                args.add("SHARED");
                if (permits > 0) {
                    args.add("LIMIT");
                    args.add(Integer.toString(permits));
                }
            }
            boolean waiting = false;
            if (queueMs > 0) {
                args.add("QUEUE");
                args.add(Long.toString(queueMs));
                if (notifyRequest != null) {
                    args.add("NOTIFY");
                    args.add(Long.toString(notifyRequest));
                }
                waiting = true;
            } else if (waitMs != null) {
                args.add("WAIT");
                args.add(Long.toString(waitMs));
                waiting = true;
            }
            if (claimMs > 0 && waiting) {
                args.add("CLAIM");
                args.add(Long.toString(Math.min(claimMs, ttlMs)));
            }
            if (meta != null) {
                args.add("META");
                args.add(meta);
            }
            return args;
        }
    }

    /**
     * {@code DLOCK.RENEW resource token ttl-ms [FENCE fence]}: with the grant's fence, so that a
     * late or retried RENEW never extends a later grant.
     *
     * @param resource the lock's key
     * @param token the lease's token
     * @param ttlMs the new length
     * @param fence the grant's fence, or 0 for a server without FENCE
     * @return the argument vector
     */
    public static List<String> renewArgs(String resource, String token, long ttlMs, long fence) {
        List<String> args = new ArrayList<>(List.of(RENEW, resource, token, Long.toString(ttlMs)));
        if (fence != 0) {
            args.add("FENCE");
            args.add(Long.toUnsignedString(fence));
        }
        return args;
    }

    /**
     * {@code DLOCK.RELEASE resource token [FENCE fence]}. Without a fence (an attempt whose outcome
     * is unknown) it frees that attempt's grant and takes its ticket out of line.
     *
     * @param resource the lock's key
     * @param token the lease's token
     * @param fence the grant's fence, or 0 for none
     * @return the argument vector
     */
    public static List<String> releaseArgs(String resource, String token, long fence) {
        List<String> args = new ArrayList<>(List.of(RELEASE, resource, token));
        if (fence != 0) {
            args.add("FENCE");
            args.add(Long.toUnsignedString(fence));
        }
        return args;
    }

    /**
     * {@code DLOCK.ACQUIREALL numkeys resource ... token ttl-ms [QUEUE ticket-ms] [META value]}: an
     * exclusive lease on every resource, in the caller's order, or on none.
     *
     * @param resources the set's members, in the order their fences are answered
     * @param token the attempt's token
     * @param ttlMs each lease's length
     * @param queueMs the set's ticket ({@code QUEUE}), or 0 for none
     * @param meta what the holder says of itself ({@code META}), or null
     * @return the argument vector
     */
    static List<String> acquireAllArgs(List<String> resources, String token, long ttlMs, long queueMs, String meta) {
        List<String> args = setArgs(ACQUIREALL, resources, token);
        args.add(Long.toString(ttlMs));
        if (queueMs > 0) {
            args.add("QUEUE");
            args.add(Long.toString(queueMs));
        }
        if (meta != null) {
            args.add("META");
            args.add(meta);
        }
        return args;
    }

    /**
     * {@code DLOCK.RENEWALL numkeys resource ... token ttl-ms FENCES fence ...}: every member
     * renewed, or none.
     *
     * @param resources the set's members
     * @param token the set's token
     * @param ttlMs the new length
     * @param fences the members' fences, in the resources' order
     * @return the argument vector
     */
    static List<String> renewAllArgs(List<String> resources, String token, long ttlMs, long[] fences) {
        List<String> args = setArgs(RENEWALL, resources, token);
        args.add(Long.toString(ttlMs));
        addFences(args, fences);
        return args;
    }

    /**
     * {@code DLOCK.RELEASEALL numkeys resource ... token [FENCES fence ...]}. Without fences (an
     * attempt that ended without a grant) it frees what the attempt's token holds of the set and
     * takes its tickets out of every line.
     *
     * @param resources the set's members
     * @param token the set's token
     * @param fences the members' fences, in the resources' order, or null for none
     * @return the argument vector
     */
    static List<String> releaseAllArgs(List<String> resources, String token, long[] fences) {
        List<String> args = setArgs(RELEASEALL, resources, token);
        if (fences != null) {
            addFences(args, fences);
        }
        return args;
    }

    private static List<String> setArgs(String command, List<String> resources, String token) {
        List<String> args = new ArrayList<>(resources.size() + 8);
        args.add(command);
        args.add(Integer.toString(resources.size()));
        args.addAll(resources);
        args.add(token);
        return args;
    }

    private static void addFences(List<String> args, long[] fences) {
        args.add("FENCES");
        for (long fence : fences) {
            args.add(Long.toUnsignedString(fence));
        }
    }

    /** Whether args is a command on a set: its second argument is numkeys, its keys follow. */
    static boolean onSet(List<String> args) {
        String command = args.get(0);
        return command.equals(ACQUIREALL) || command.equals(RENEWALL) || command.equals(RELEASEALL);
    }

    /**
     * A set's ticket: as long as its wait, from 1 s to 30 s; 30 s for a wait without limit (null).
     */
    static long setTicketMs(Duration wait) {
        if (wait == null) {
            return SET_TICKET_MAX_MS;
        }
        return Math.min(SET_TICKET_MAX_MS, Math.max(SET_TICKET_MIN_MS, wait.toMillis()));
    }

    /**
     * An {@code ACQUIREALL} reply: the {@code count} fences in the caller's order, or null (nil: not
     * granted).
     */
    static long[] fencesOf(Object reply, int count) {
        if (reply == null) {
            return null;
        }
        if (reply instanceof List<?> list && list.size() == count) {
            long[] fences = new long[count];
            for (int i = 0; i < count; i++) {
                fences[i] = unsigned(list.get(i));
            }
            return fences;
        }
        throw new DlockException("dlock: unexpected reply " + reply);
    }

    /**
     * {@code DLOCK.FENCECHECK resource fence}.
     *
     * @param resource the lock's key
     * @param fence a fence
     * @return the argument vector
     */
    public static List<String> fenceCheckArgs(String resource, long fence) {
        return List.of(FENCECHECK, resource, Long.toUnsignedString(fence));
    }

    /**
     * {@code DLOCK.INFO resource}.
     *
     * @param resource the lock's key
     * @return the argument vector
     */
    public static List<String> infoArgs(String resource) {
        return List.of(INFO, resource);
    }

    /**
     * {@code DLOCK.FENCED resource fence command [arg ...]}.
     *
     * @param resource the lock's key
     * @param fence the lease's fence
     * @param command the inner command and its arguments
     * @return the argument vector
     */
    public static List<String> fencedArgs(String resource, long fence, List<String> command) {
        List<String> args = new ArrayList<>(List.of(FENCED, resource, Long.toUnsignedString(fence)));
        args.addAll(command);
        return args;
    }

    /**
     * The class of an error reply (its whole text, code first): what a client does next
     * ({@code docs/protocol.md}, section 9).
     *
     * @param reply the error reply
     * @return its class
     */
    public static ErrorClass errorClass(String reply) {
        int space = reply.indexOf(' ');
        String code = space < 0 ? reply : reply.substring(0, space);
        switch (code) {
            case "MOVED": case "ASK": return ErrorClass.REDIRECT;
            case "TRYAGAIN": case "LOADING": case "CLUSTERDOWN": case "MASTERDOWN": return ErrorClass.RETRY;
            case "READONLY": return ErrorClass.FAILOVER;
            case "UNBLOCKED": return ErrorClass.UNBLOCKED;
            case "STALE": return ErrorClass.STALE;
            case "CROSSSLOT": return ErrorClass.CROSS_SLOT;
            case "LOCKMODE": return ErrorClass.MODE_CONFLICT;
            case "NOAUTH": case "WRONGPASS": case "NOPERM": return ErrorClass.AUTH;
            case "WRONGTYPE": return ErrorClass.WRONG_TYPE;
            case "ERR":
                if (unsupportedOption(reply).isPresent()) {
                    return ErrorClass.UNSUPPORTED;
                }
                if (reply.startsWith("ERR fence counter exhausted") || reply.startsWith("ERR internal error")) {
                    return ErrorClass.SERVER;
                }
                return ErrorClass.USAGE;
            default:
                return ErrorClass.SERVER;
        }
    }

    /**
     * The option keyword an older server refused as an unknown argument, upper case.
     *
     * @param reply an error reply
     * @return the option, or empty
     */
    public static Optional<String> unsupportedOption(String reply) {
        if (reply == null || !reply.startsWith(UNEXPECTED_ARGUMENT) || !reply.endsWith("'")
                || reply.length() <= UNEXPECTED_ARGUMENT.length()) {
            return Optional.empty();
        }
        String named = reply.substring(UNEXPECTED_ARGUMENT.length(), reply.length() - 1).toUpperCase(Locale.ROOT);
        return OPTION_KEYWORDS.contains(named) ? Optional.of(named) : Optional.empty();
    }

    /**
     * The largest value a bounds error allows ({@code "... between 0 and 86400000"} gives
     * 86400000), or -1.
     *
     * @param reply an error reply
     * @return the bound, or -1
     */
    public static long upperBound(String reply) {
        int at = reply.lastIndexOf(" between ");
        if (at < 0) {
            return -1;
        }
        String rest = reply.substring(at + " between ".length());
        int and = rest.indexOf(" and ");
        if (and < 0) {
            return -1;
        }
        String digits = rest.substring(and + " and ".length()).split(" ", 2)[0];
        try {
            return Long.parseLong(digits);
        } catch (NumberFormatException e) {
            return -1;
        }
    }

    // ---- The client's rules (docs/protocol.md, sections 2, 3, 9 and 13), each written once here ----

    /**
     * The options an older module may refuse that the client can leave out (QUEUE: it then waits
     * by blocking; NOTIFY: a ticket then waits on the resource's channel).
     */
    static final List<String> DROPPABLE_OPTIONS = List.of("CLAIM", "META", "FENCE", "QUEUE", "NOTIFY");

    /** Whether a refused option may be left out for the rest of the Locks' life. */
    static boolean droppable(String option) {
        return DROPPABLE_OPTIONS.contains(option);
    }

    /**
     * A length as the server is sent it: whole milliseconds, rounded down (the local view of a lease
     * is never longer than the server's), at least 1.
     */
    static long wholeMs(Duration length) {
        return Math.max(1, length.toMillis());
    }

    /**
     * The claim window sent with a WAIT or a ticket: twice the request timeout, at least 1 s, and
     * with a ticket at least the ticket's length ({@code ticketMs}, 0 for a wait). The argument
     * vector caps it by the ttl ({@link AcquireForm#args()}).
     */
    static long claimWindowMs(Duration requestTimeout, long ticketMs) {
        return Math.max(Math.max(1000, 2 * requestTimeout.toMillis()), ticketMs);
    }

    /**
     * The conservative local expiry of a lease: the send time (nanoTime) of the ACQUIRE or RENEW that
     * was answered plus the ttl it carried, in whole milliseconds as sent.
     */
    static long localExpiry(long sentNanos, long ttlMs) {
        return sentNanos + ttlMs * 1_000_000;
    }

    /** A held lease is renewed every third of its ttl. */
    static long renewalPeriodNanos(long ttlMs) {
        return ttlMs * 1_000_000 / 3;
    }

    /** After a renewal that got no answer, it is tried again every tenth of the ttl until the local expiry. */
    static long renewalRetryNanos(long ttlMs) {
        return ttlMs * 1_000_000 / 10;
    }

    /**
     * Whether a ticket starts on its own channel's {@code granted} message, and the local expiry of
     * the lease it starts ({@code docs/protocol.md}, section 2, Tickets): the send time (nanoTime)
     * of the ACQUIRE the message names plus the window, if that leaves more than a request timeout
     * from {@code now}. Empty: the message only wakes the ticket, whose next ACQUIRE claims the
     * turn (the request is not one of the attempt's, or too little of the window is left).
     */
    static java.util.OptionalLong startedExpiry(Granted message, List<Long> sentNanos, long now, Duration requestTimeout) {
        java.util.OptionalLong expiry = grantedExpiry(message, sentNanos, 1_000_000);
        if (expiry.isPresent() && expiry.getAsLong() - (now + requestTimeout.toNanos()) > 0) {
            return expiry;
        }
        return java.util.OptionalLong.empty();
    }

    /** A ticket is sent again at least every third of its length, whatever the channel says. */
    static long ticketRefreshMs(long ticketMs) {
        return Math.max(1, ticketMs / 3);
    }

    /**
     * The server's longest WAIT, when the reply refused a longer one ({@code ERR timeout-ms must be
     * between 0 and N}): the client then waits in slices of it. -1 for any other reply.
     */
    static long longestWaitMs(String reply) {
        if (reply == null || !reply.startsWith("ERR timeout-ms ")) {
            return -1;
        }
        long bound = upperBound(reply);
        return bound > 0 ? bound : -1;
    }

    /** The log lines (their text and level), the same in every client; the fields follow as key=value. */
    enum LogLine {
        LEASE_ACQUIRED("dlock: lease acquired", System.Logger.Level.INFO),
        RENEWAL_FAILED("dlock: renewal failed", System.Logger.Level.WARNING),
        LEASE_RELEASED("dlock: lease released", System.Logger.Level.INFO),
        RELEASE_FAILED("dlock: release failed", System.Logger.Level.WARNING),
        LEASE_LOST("dlock: lease lost", System.Logger.Level.WARNING),
        STALE_REJECTED("dlock: stale operation rejected", System.Logger.Level.WARNING);

        final String text;
        final System.Logger.Level level;

        LogLine(String text, System.Logger.Level level) {
            this.text = text;
            this.level = level;
        }

        /** The line with its fields: {@code format("resource", r, "fence", f)} gives "... resource=r fence=f". */
        String format(Object... keysAndValues) {
            StringBuilder line = new StringBuilder(text);
            for (int i = 0; i + 1 < keysAndValues.length; i += 2) {
                line.append(' ').append(keysAndValues[i]).append('=').append(keysAndValues[i + 1]);
            }
            return line.toString();
        }
    }

    /**
     * Reads a {@code DLOCK.INFO} reply as this client decodes replies: a flat list of names and
     * values (RESP2) or a map (RESP3), by field name (fields of later versions change nothing).
     *
     * @param reply the decoded reply
     * @return what it shows, or empty for nil (no lease, nobody waiting)
     */
    public static Optional<Info> parseInfo(Object reply) {
        if (reply == null) {
            return Optional.empty();
        }
        Map<String, Object> fields = new LinkedHashMap<>();
        if (reply instanceof Map<?, ?> map) {
            map.forEach((name, value) -> {
                if (name instanceof String text) {
                    fields.put(text, value);
                }
            });
        } else if (reply instanceof List<?> list) {
            for (int i = 0; i + 1 < list.size(); i += 2) {
                if (list.get(i) instanceof String text) {
                    fields.put(text, list.get(i + 1));
                }
            }
        } else {
            throw new DlockException("unexpected DLOCK.INFO reply " + reply);
        }
        List<String> next = new ArrayList<>();
        if (fields.get("next-waiters") instanceof List<?> list) {
            for (Object item : list) {
                if (item instanceof String token) {
                    next.add(token);
                }
            }
        }
        List<Info.Holder> leases = new ArrayList<>();
        if (fields.get("leases") instanceof List<?> list) {
            for (Object item : list) {
                if (item instanceof List<?> lease && lease.size() >= 4) {
                    leases.add(new Info.Holder(text(lease.get(0)), unsigned(lease.get(1)),
                            count(lease.get(2)), text(lease.get(3))));
                }
            }
        }
        Long fence = fields.containsKey("fence") && fields.get("fence") != null ? unsigned(fields.get("fence")) : null;
        return Optional.of(new Info(text(fields.get("owner")), fence, count(fields.get("ttl-ms")),
                count(fields.get("waiters")), Collections.unmodifiableList(next), count(fields.get("tickets")),
                text(fields.get("mode")), count(fields.get("holders")), text(fields.get("meta")),
                Collections.unmodifiableList(leases)));
    }

    /**
     * The leader a {@code DLOCK.INFO} reply shows: the holder of a live exclusive lease (a
     * version 1 server shows no mode, and its lease is exclusive).
     *
     * @param reply the decoded reply
     * @return the leader, or empty
     */
    public static Optional<Leader> leaderFromInfo(Object reply) {
        Optional<Info> info = parseInfo(reply);
        if (info.isEmpty() || info.get().owner() == null || info.get().fence() == null) {
            return Optional.empty();
        }
        if (info.get().mode() != null && !info.get().mode().equals("exclusive")) {
            return Optional.empty();
        }
        return Optional.of(new Leader(info.get().owner(), info.get().fence(), info.get().meta()));
    }

    private static String text(Object value) {
        return value instanceof String text ? text : null;
    }

    private static long count(Object value) {
        if (value instanceof Long n) {
            return n;
        }
        if (value instanceof String text) {
            try {
                return Long.parseLong(text);
            } catch (NumberFormatException e) {
                return 0;
            }
        }
        return 0;
    }

    /** A fence as an unsigned 64-bit number held in a long (Long.toUnsignedString prints it). */
    static long unsigned(Object value) {
        if (value instanceof Long n) {
            return n;
        }
        if (value instanceof BigInteger big && big.signum() >= 0 && big.compareTo(TWO_TO_64) < 0) {
            return big.longValue();
        }
        if (value instanceof String text) {
            return Long.parseUnsignedLong(text);
        }
        throw new DlockException("unexpected fence " + value);
    }
}
