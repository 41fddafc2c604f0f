package dev.dlock;

import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.output.CommandOutput;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Decodes any reply into plain values: null, Long, String (bulk and simple strings), Double,
 * Boolean, BigInteger, List, and a LinkedHashMap for a RESP3 map. Error replies complete the
 * command exceptionally (Lettuce's RedisCommandExecutionException with the reply's text).
 */
final class ReplyOutput extends CommandOutput<String, String, Object> {
    /** Containers being filled, innermost first; a map is filled as a flat list and turned into a map when done. */
    private final Deque<List<Object>> open = new ArrayDeque<>();
    private final Deque<Boolean> isMap = new ArrayDeque<>();
    private final Deque<Integer> remaining = new ArrayDeque<>();

    ReplyOutput() {
        super(StringCodec.UTF8, null);
    }

    private void add(Object value) {
        if (open.isEmpty()) {
            output = value;
            return;
        }
        open.peek().add(value);
        closeFinished();
    }

    private void closeFinished() {
        while (!open.isEmpty() && open.peek().size() >= remaining.peek()) {
            List<Object> done = open.pop();
            remaining.pop();
            Object value = done;
            if (isMap.pop()) {
                Map<Object, Object> map = new LinkedHashMap<>();
                for (int i = 0; i + 1 < done.size(); i += 2) {
                    map.put(done.get(i), done.get(i + 1));
                }
                value = map;
            }
            if (open.isEmpty()) {
                output = value;
            } else {
                open.peek().add(value);
            }
        }
    }

    private void start(int count, boolean map) {
        int items = map ? 2 * count : count;
        if (count < 0) {
            add(null);
            return;
        }
        open.push(new ArrayList<>(Math.max(items, 0)));
        isMap.push(map);
        remaining.push(items);
        closeFinished();
    }

    @Override
    public void set(ByteBuffer bytes) {
        add(bytes == null ? null : decodeString(bytes));
    }

    @Override
    public void setSingle(ByteBuffer bytes) {
        add(bytes == null ? null : decodeString(bytes));
    }

    @Override
    public void setBigNumber(ByteBuffer bytes) {
        add(new BigInteger(decodeString(bytes)));
    }

    @Override
    public void set(long integer) {
        add(integer);
    }

    @Override
    public void set(double number) {
        add(number);
    }

    @Override
    public void set(boolean value) {
        add(value);
    }

    @Override
    public void multi(int count) {
        start(count, false);
    }

    @Override
    public void multiArray(int count) {
        start(count, false);
    }

    @Override
    public void multiPush(int count) {
        start(count, false);
    }

    @Override
    public void multiSet(int count) {
        start(count, false);
    }

    @Override
    public void multiMap(int count) {
        start(count, true);
    }
}
