package dev.dlock.spring.integration.example;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.dlock.spring.integration.DlockLockRegistry;
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
import org.springframework.integration.support.locks.LockRegistry;

/**
 * The switch from {@code RedisLockRegistry} to dlock is the configuration's one bean
 * ({@link LockConfig}): two application contexts (two nodes) with it and the unchanged
 * {@link InvoiceService} pay the same invoice one after the other, each under a fence.
 */
class SwitchExampleTest {
    @Test
    void twoNodesConfiguredWithTheDlockBeanPayAnInvoiceOneAtATime() throws Exception {
        try (Servers.Server server = Servers.start(); var nodeA = node(server); var nodeB = node(server)) {
            assertTrue(nodeA.getBean(LockRegistry.class) instanceof DlockLockRegistry);
            InvoiceService a = nodeA.getBean(InvoiceService.class);
            InvoiceService b = nodeB.getBean(InvoiceService.class);
            CompletableFuture<Void> paidA = CompletableFuture.runAsync(() -> pay(a, "42"));
            CompletableFuture<Void> paidB = CompletableFuture.runAsync(() -> pay(b, "42"));
            CompletableFuture.allOf(paidA, paidB).get(10, TimeUnit.SECONDS);
            assertEquals(1, a.ledger.size());
            assertEquals(1, b.ledger.size());
            InvoiceService.Payment first = a.ledger.get(0);
            InvoiceService.Payment second = b.ledger.get(0);
            if (second.startedNanos() < first.startedNanos()) {
                InvoiceService.Payment earlier = second;
                second = first;
                first = earlier;
            }
            assertTrue(first.endedNanos() <= second.startedNanos(), "the two payments overlapped: " + first + ", " + second);
            assertTrue(first.fence() > 0 && second.fence() > first.fence(), first + ", " + second);
            assertTrue(server.command("EXISTS", "invoices:42").equals(":0"), "released");
        }
        assertEquals(readmeRegion(), javaBlock(), "README.md's Java block is LockConfig's README region");
    }

    private static void pay(InvoiceService service, String invoice) {
        try {
            service.pay(invoice);
        } catch (InterruptedException e) {
            throw new IllegalStateException(e);
        }
    }

    private static AnnotationConfigApplicationContext node(Servers.Server server) {
        AnnotationConfigApplicationContext context = new AnnotationConfigApplicationContext();
        context.getEnvironment().getPropertySources().addFirst(new MapPropertySource("test", Map.of("dlock.url", server.url())));
        context.register(LockConfig.class, InvoiceService.class);
        context.refresh();
        return context;
    }

    private static String javaBlock() throws Exception {
        List<String> lines = Files.readAllLines(Path.of("README.md"));
        int from = lines.indexOf("```java");
        int to = lines.subList(from + 1, lines.size()).indexOf("```") + from + 1;
        return String.join("\n", lines.subList(from + 1, to));
    }

    private static String readmeRegion() throws Exception {
        List<String> lines = Files.readAllLines(Path.of("src/test/java/dev/dlock/spring/integration/example/LockConfig.java"));
        int from = lines.indexOf("    // README:begin");
        int to = lines.indexOf("    // README:end");
        List<String> region = new ArrayList<>();
        for (String line : lines.subList(from + 1, to)) {
            region.add(line.startsWith("    ") ? line.substring(4) : line);
        }
        return String.join("\n", region);
    }
}
