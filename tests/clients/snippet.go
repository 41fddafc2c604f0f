// Acquire, write under the fence, release, from go-redis v9 (tested with go-redis 9.18.0).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

func main() {
	ctx := context.Background()
	port := "6379"
	if len(os.Args) > 1 {
		port = os.Args[1]
	}
	rdb := redis.NewClient(&redis.Options{
		Addr:        "127.0.0.1:" + port,
		ReadTimeout: 10 * time.Second, // above the 5 s WAIT, or the client gives up first
		MaxRetries:  -1,               // no silent retries: a retried DLOCK.FENCED could write twice
	})
	random := make([]byte, 16)
	rand.Read(random)
	token := hex.EncodeToString(random) // made before the first send; a retried ACQUIRE sends the same token
	// WAIT blocks its connection: on a client shared with renewals, use a connection of its own (rdb.Conn()).
	// CLAIM: a lease handed over to a client that gave up (and never claims it) lapses in 10 s.
	fence, err := rdb.Do(ctx, "DLOCK.ACQUIRE", "invoice:{123}", token, 30000, "WAIT", 5000, "CLAIM", 10000).Int64()
	if errors.Is(err, redis.Nil) {
		log.Fatal("invoice:{123} is held by someone else; try again later")
	} else if err != nil {
		// Failed on this side: the lease may have been handed over as it failed. go-redis closed
		// that connection; release the token (this attempt's alone) from another one.
		rdb.Do(ctx, "DLOCK.RELEASE", "invoice:{123}", token)
		log.Fatal(err)
	}
	// Claim it: the same ACQUIRE again answers the same fence and starts the full ttl.
	rdb.Do(ctx, "DLOCK.ACQUIRE", "invoice:{123}", token, 30000)
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
