package dev.dlock.shedlock.example;

import dev.dlock.shedlock.DlockLockProvider;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import net.javacrumbs.shedlock.spring.annotation.SchedulerLock;
import org.springframework.stereotype.Component;

/**
 * A scheduled task as a ShedLock user writes it (its {@code @Scheduled} trigger left out: the test
 * calls it): the same whichever provider the configuration defines.
 */
@Component
public class NightlyReport {
    private final List<Long> published = new CopyOnWriteArrayList<>();

    @SchedulerLock(name = "nightly-report", lockAtMostFor = "PT10M")
    public void run() throws InterruptedException {
        long fence = DlockLockProvider.current().orElseThrow().fence(); // send it with the write
        Thread.sleep(150); // the report's work, under the lock
        published.add(fence);
    }

    /**
     * The fences the report was published with, one per run on this node (a method: the bean is
     * ShedLock's proxy, whose fields are not the task's).
     *
     * @return the fences
     */
    public List<Long> published() {
        return published;
    }
}
