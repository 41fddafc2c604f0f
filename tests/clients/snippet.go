// Acquire, write under the fence, release, from go-redis v9. Not run by the tests: no Go
// toolchain is installed where they run.
package main

import (
	"context"
	"errors"
	"log"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

func main() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:        "127.0.0.1:6379",
		ReadTimeout: 10 * time.Second, // above the 5 s WAIT, or the client gives up first
		MaxRetries:  -1,               // no silent retries: a retried DLOCK.FENCED could write twice
	})
	token := uuid.NewString() // made before the first send; a retried ACQUIRE sends the same token
	// WAIT blocks its connection: on a client shared with renewals, use a connection of its own (rdb.Conn()).
	fence, err := rdb.Do(ctx, "DLOCK.ACQUIRE", "invoice:{123}", token, 30000, "WAIT", 5000).Int64()
	if errors.Is(err, redis.Nil) {
		log.Fatal("invoice:{123} is held by someone else; try again later")
	} else if err != nil {
		log.Fatal(err) // outcome unknown: retry with the same token, or let the lease expire
	}
	defer func() {
		released, err := rdb.Do(ctx, "DLOCK.RELEASE", "invoice:{123}", token).Int()
		if err != nil || released == 0 {
			log.Printf("release: %d %v (0: the lease had already ended)", released, err)
		}
	}()
	err = rdb.Do(ctx, "DLOCK.FENCED", "invoice:{123}", fence, "HSET", "invoice:{123}:data", "status", "paid").Err()
	switch {
	case err != nil && strings.HasPrefix(err.Error(), "STALE"):
		log.Print("the lease ended before the write; nothing was written")
	case err != nil:
		log.Print(err)
	default:
		log.Printf("paid under fence %d", fence)
	}
}
