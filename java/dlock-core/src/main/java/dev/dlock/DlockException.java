package dev.dlock;

/** The base of every exception this client throws; all are unchecked. */
public class DlockException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /**
     * An exception with a message.
     *
     * @param message what happened
     */
    public DlockException(String message) {
        super(message);
    }

    /**
     * An exception with a message and a cause.
     *
     * @param message what happened
     * @param cause why
     */
    public DlockException(String message, Throwable cause) {
        super(message, cause);
    }
}
