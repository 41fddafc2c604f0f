package dev.dlock.shedlock.example;

import dev.dlock.Locks;
import dev.dlock.shedlock.DlockLockProvider;
import net.javacrumbs.shedlock.core.LockProvider;
import net.javacrumbs.shedlock.spring.annotation.EnableSchedulerLock;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;

/**
 * A Spring application's ShedLock configuration. Before, with ShedLock's Redis provider
 * (shedlock-provider-redis-spring):
 *
 * <pre>{@code
 * @Bean
 * public LockProvider lockProvider(RedisConnectionFactory connectionFactory) {
 *     return new RedisLockProvider(connectionFactory);
 * }
 * }</pre>
 *
 * After, with dlock: the {@code LockProvider} bean below and the {@code Locks} it uses; the
 * {@code @SchedulerLock} methods ({@link NightlyReport}) are the same.
 */
@Configuration
@EnableSchedulerLock(defaultLockAtMostFor = "PT30S")
public class SchedulerConfig {
    // README:begin
    @Bean(destroyMethod = "close")
    public Locks locks(@Value("${dlock.url}") String url) {
        return Locks.connect(url);
    }

    @Bean
    public LockProvider lockProvider(Locks locks) {
        return new DlockLockProvider(locks);
    }
    // README:end
}
