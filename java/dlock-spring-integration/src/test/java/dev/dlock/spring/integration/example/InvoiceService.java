package dev.dlock.spring.integration.example;

import dev.dlock.spring.integration.DlockLock;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.locks.Lock;
import org.springframework.integration.support.locks.LockRegistry;
import org.springframework.stereotype.Service;

/**
 * Application code written against Spring Integration's {@code LockRegistry} alone: it runs the same
 * whichever registry the configuration defines.
 */
@Service
public class InvoiceService {
    private final LockRegistry<?> locks;
    /** What was paid: the invoice, the fence it was written with (0 without dlock), when. */
    final List<Payment> ledger = new CopyOnWriteArrayList<>();

    record Payment(String invoice, long fence, long startedNanos, long endedNanos) {}

    public InvoiceService(LockRegistry<?> locks) {
        this.locks = locks;
    }

    public void pay(String invoice) throws InterruptedException {
        locks.executeLocked(invoice, () -> {
            Lock lock = locks.obtain(invoice); // the lock this thread holds now
            long fence = lock instanceof DlockLock dlock ? dlock.fence() : 0; // send it with the write
            long started = System.nanoTime();
            Thread.sleep(50); // the payment's work, under the lock
            ledger.add(new Payment(invoice, fence, started, System.nanoTime()));
        });
    }
}
