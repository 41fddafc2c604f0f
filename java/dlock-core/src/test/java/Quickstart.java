import dev.dlock.HoldOptions;
import dev.dlock.Lease;
import dev.dlock.Locks;
import java.time.Duration;

public class Quickstart {
    public static void main(String[] args) {
        String url = System.getenv().getOrDefault("REDIS_URL", "redis://127.0.0.1:6379");
        try (Locks locks = Locks.connect(url);
             Lease lease = locks.hold("invoice:42", HoldOptions.defaults().ttl(Duration.ofSeconds(30)))) {
            pay(lease.fence()); // send the fence with every write the lease protects
            lease.check();      // throws LeaseLostException once the lease is gone
        }   // close() releases; it throws LeaseLostException if the lease was lost meanwhile
    }

    static void pay(long fence) {
        System.out.println("paid under fence " + fence);
    }
}
