module github.com/dlock-dev/dlock/go/examples

go 1.22

require github.com/dlock-dev/dlock/go v0.0.0

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dgryski/go-rendezvous v0.0.0-20200823014737-9f7001d12a5f // indirect
	github.com/lib/pq v1.10.9
	github.com/redis/go-redis/v9 v9.18.0
	go.uber.org/atomic v1.11.0 // indirect
)

replace github.com/dlock-dev/dlock/go => ../
