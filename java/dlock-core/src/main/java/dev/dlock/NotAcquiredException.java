package dev.dlock;

/**
 * An acquire that granted nothing: the resource stayed held ({@link Outcome#HELD}), no request
 * could reach a server ({@link Outcome#UNREACHABLE}), or a request may have arrived and no answer
 * came before the deadline ({@link Outcome#UNKNOWN}: the attempt's token was then released, and
 * {@link #released()} says whether a grant was found and freed).
 */
public class NotAcquiredException extends DlockException {
    private static final long serialVersionUID = 1L;

    /** Why nothing was acquired. */
    public enum Outcome {
        /** The resource stayed held by others until the wait ended. */
        HELD,
        /** No request of the attempt could have reached a server: nothing was granted. */
        UNREACHABLE,
        /** A request may have reached the server; the token was released. */
        UNKNOWN;

        /**
         * The outcome as the contract writes it ({@code held}).
         *
         * @return the wire name
         */
        public String wireName() {
            return name().toLowerCase(java.util.Locale.ROOT);
        }
    }

    private final String resource;
    private final Outcome outcome;
    private final String token;
    private final boolean released;

    /**
     * An acquire that granted nothing.
     *
     * @param resource the lock's key
     * @param outcome why
     * @param token the attempt's token
     * @param released with {@link Outcome#UNKNOWN}: whether the token's release freed a grant
     * @param cause the last failure, or null
     */
    public NotAcquiredException(String resource, Outcome outcome, String token, boolean released, Throwable cause) {
        super(message(resource, outcome, released, cause), cause);
        this.resource = resource;
        this.outcome = outcome;
        this.token = token;
        this.released = released;
    }

    private static String message(String resource, Outcome outcome, boolean released, Throwable cause) {
        String why = cause == null ? "" : ": " + cause.getMessage();
        switch (outcome) {
            case HELD:
                return "dlock: \"" + resource + "\" not acquired: held by another owner";
            case UNKNOWN:
                return "dlock: \"" + resource + "\": outcome unknown (token released: " + released + ")" + why;
            default:
                return "dlock: \"" + resource + "\" not acquired (unreachable)" + why;
        }
    }

    /**
     * The lock's key.
     *
     * @return the resource
     */
    public String resource() {
        return resource;
    }

    /**
     * Why nothing was acquired.
     *
     * @return the outcome
     */
    public Outcome outcome() {
        return outcome;
    }

    /**
     * The attempt's token (with {@link Outcome#UNKNOWN}: the one that was released).
     *
     * @return the token
     */
    public String token() {
        return token;
    }

    /**
     * With {@link Outcome#UNKNOWN}: whether the release of the token found a grant and freed it.
     *
     * @return whether a grant was released
     */
    public boolean released() {
        return released;
    }
}
