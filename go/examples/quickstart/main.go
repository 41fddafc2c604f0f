package main

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock-dev/dlock/go"
)

func main() {
	opts, err := redis.ParseURL(cmp.Or(os.Getenv("REDIS_URL"), "redis://127.0.0.1:6379"))
	if err != nil {
		log.Fatal(err)
	}
	locks := dlock.New(redis.NewClient(opts)) // or a *redis.ClusterClient
	err = locks.Do(context.Background(), "invoice:42", func(ctx context.Context, lease *dlock.Lease) error {
		// ctx is cancelled if the lease is lost; send lease.Fence() with every write.
		return pay(ctx, lease.Fence())
	}, dlock.TTL(30*time.Second), dlock.Wait(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
}

// pay stands for the work the lease protects.
func pay(ctx context.Context, fence uint64) error {
	fmt.Printf("paid under fence %d\n", fence)
	return ctx.Err()
}
