package dev.dlock.shedlock.example;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.dlock.Locks;
import dev.dlock.testkit.Servers;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.springframework.context.annotation.AnnotationConfigApplicationContext;
import org.springframework.core.env.MapPropertySource;

/**
 * A Spring application switches its ShedLock provider to dlock by configuration
 * ({@link SchedulerConfig}): two application contexts (two nodes) with it run the unchanged
 * {@code @SchedulerLock} task ({@link NightlyReport}); while one runs it, the other skips it.
 */
class SpringExampleTest {
    @Test
    void twoNodesConfiguredWithTheDlockProviderRunTheTaskOnce() throws Exception {
        try (Servers.Server server = Servers.start(); var nodeA = node(server); var nodeB = node(server)) {
            NightlyReport a = nodeA.getBean(NightlyReport.class);
            NightlyReport b = nodeB.getBean(NightlyReport.class);
            Locks locks = nodeA.getBean(Locks.class);
            CompletableFuture<Void> runA = CompletableFuture.runAsync(() -> run(a));
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
            while (locks.info("shedlock:nightly-report").isEmpty()) {
                assertTrue(System.nanoTime() < deadline, "node A never took the lock");
                Thread.sleep(5);
            }
            b.run(); // node A holds the lock: skipped
            runA.get(5, TimeUnit.SECONDS);
            assertEquals(1, a.published().size());
            assertEquals(List.of(), b.published(), "node B ran the task while node A held the lock");
            b.run(); // released at the end of A's run: B runs it now, with a larger fence
            assertEquals(1, b.published().size());
            assertTrue(b.published().get(0) > a.published().get(0));
        }
        assertEquals(readmeRegion(), javaBlock(), "README.md's Spring block is SchedulerConfig's README region");
    }

    private static void run(NightlyReport report) {
        try {
            report.run();
        } catch (InterruptedException e) {
            throw new IllegalStateException(e);
        }
    }

    private static AnnotationConfigApplicationContext node(Servers.Server server) {
        AnnotationConfigApplicationContext context = new AnnotationConfigApplicationContext();
        context.getEnvironment().getPropertySources().addFirst(new MapPropertySource("test", Map.of("dlock.url", server.url())));
        context.register(SchedulerConfig.class, NightlyReport.class);
        context.refresh();
        return context;
    }

    /** The README's Java block that follows its "With Spring" line. */
    private static String javaBlock() throws Exception {
        List<String> lines = Files.readAllLines(Path.of("README.md"));
        int spring = 0;
        while (!lines.get(spring).startsWith("With Spring's `@SchedulerLock`")) {
            spring++;
        }
        int from = lines.subList(spring, lines.size()).indexOf("```java") + spring;
        int to = lines.subList(from + 1, lines.size()).indexOf("```") + from + 1;
        return String.join("\n", lines.subList(from + 1, to));
    }

    private static String readmeRegion() throws Exception {
        List<String> lines = Files.readAllLines(Path.of("src/test/java/dev/dlock/shedlock/example/SchedulerConfig.java"));
        int from = lines.indexOf("    // README:begin");
        int to = lines.indexOf("    // README:end");
        List<String> region = new ArrayList<>();
        for (String line : lines.subList(from + 1, to)) {
            region.add(line.startsWith("    ") ? line.substring(4) : line);
        }
        return String.join("\n", region);
    }
}
