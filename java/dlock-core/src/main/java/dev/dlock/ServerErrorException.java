package dev.dlock;

/** The server refused a request with an error reply; {@link #errorClass()} says what kind. */
public class ServerErrorException extends DlockException {
    private static final long serialVersionUID = 1L;

    private final ErrorClass errorClass;
    private final String reply;

    /**
     * A server's refusal.
     *
     * @param reply the error reply, code first
     */
    public ServerErrorException(String reply) {
        super("dlock: server replied " + reply);
        this.reply = reply;
        this.errorClass = Protocol.errorClass(reply);
    }

    /**
     * The reply's class.
     *
     * @return the class
     */
    public ErrorClass errorClass() {
        return errorClass;
    }

    /**
     * The error reply as the server sent it.
     *
     * @return the reply
     */
    public String reply() {
        return reply;
    }
}
