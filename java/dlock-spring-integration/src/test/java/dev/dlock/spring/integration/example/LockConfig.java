package dev.dlock.spring.integration.example;

import dev.dlock.spring.integration.DlockLockRegistry;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.integration.support.locks.LockRegistry;

/**
 * The application's lock configuration: its one {@code LockRegistry} bean. Before, with Spring
 * Integration's Redis registry (spring-integration-redis):
 *
 * <pre>{@code
 * @Bean
 * public LockRegistry<?> lockRegistry(RedisConnectionFactory connectionFactory) {
 *     return new RedisLockRegistry(connectionFactory, "invoices");
 * }
 * }</pre>
 *
 * After, with dlock: the bean below, nothing else changed ({@link InvoiceService} is the same).
 */
@Configuration
public class LockConfig {
    // README:begin
    @Bean
    public LockRegistry<?> lockRegistry(@Value("${dlock.url}") String url) {
        return DlockLockRegistry.connect(url, "invoices");
    }
    // README:end
}
