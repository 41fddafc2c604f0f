// Package redsync is a Mutex shaped like github.com/go-redsync/redsync/v4's, on dlock: code
// written against redsync switches by changing its import and its constructor
// (redsync.New(locks) instead of redsync.New(pool)); Lock, Unlock, Extend, Valid, Name, Value and
// Until keep their signatures. What changes underneath: the server queues waiters (no retry
// loop with sleeps), the lease is renewed every ttl/3 until Unlock (Extend renews at once), and
// every lock has a fence (Fence) for the writes it protects.
package redsync

import (
	"context"
	"errors"
	"sync"
	"time"

	dlock "github.com/dlock-dev/dlock/go"
)

// Errors named as redsync names them.
var (
	// ErrFailed: the lock was not acquired (held by another owner until the wait ended).
	ErrFailed = errors.New("redsync: failed to acquire lock")
	// ErrExtendFailed: the lock could not be extended.
	ErrExtendFailed = errors.New("redsync: failed to extend lock")
	// ErrLockAlreadyExpired: Unlock or Extend of a lock that is no longer held.
	ErrLockAlreadyExpired = errors.New("redsync: failed to unlock, lock was already expired")
)

// Redsync makes mutexes on a dlock.Locks.
type Redsync struct{ locks *dlock.Locks }

// New is redsync.New for dlock.
func New(locks *dlock.Locks) *Redsync { return &Redsync{locks: locks} }

// Option configures a Mutex.
type Option func(*Mutex)

// WithExpiry sets the lease's ttl (redsync's default: 8 s).
func WithExpiry(expiry time.Duration) Option { return func(m *Mutex) { m.expiry = expiry } }

// WithWait sets how long Lock waits in the server's queue (default 8 s; TryLock never waits).
func WithWait(wait time.Duration) Option { return func(m *Mutex) { m.wait = wait } }

// Mutex is a distributed mutual exclusion lock.
type Mutex struct {
	locks  *dlock.Locks
	name   string
	expiry time.Duration
	wait   time.Duration

	mu    sync.Mutex
	lease *dlock.Lease
}

// NewMutex returns a mutex on the resource name.
func (r *Redsync) NewMutex(name string, options ...Option) *Mutex {
	m := &Mutex{locks: r.locks, name: name, expiry: 8 * time.Second, wait: 8 * time.Second}
	for _, o := range options {
		o(m)
	}
	return m
}

// Name is the resource's name.
func (m *Mutex) Name() string { return m.name }

// Value is the current lease's token ("" when not held).
func (m *Mutex) Value() string {
	if lease := m.current(); lease != nil {
		return lease.Token()
	}
	return ""
}

// Fence is the current lease's fencing token (0 when not held): send it with every write.
func (m *Mutex) Fence() uint64 {
	if lease := m.current(); lease != nil {
		return lease.Fence()
	}
	return 0
}

// Until is when the lease ends at the latest if no renewal is answered (a conservative local
// expiry); the zero time when not held.
func (m *Mutex) Until() time.Time {
	if lease := m.current(); lease != nil {
		return lease.LocalExpiry()
	}
	return time.Time{}
}

func (m *Mutex) current() *dlock.Lease {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lease
}

// Lock locks m, waiting in the server's queue; ErrFailed if it stayed held.
func (m *Mutex) Lock() error { return m.LockContext(context.Background()) }

// LockContext locks m, waiting no longer than ctx allows.
func (m *Mutex) LockContext(ctx context.Context) error { return m.lock(ctx, m.wait) }

// TryLock locks m only if it is free now.
func (m *Mutex) TryLock() error { return m.TryLockContext(context.Background()) }

// TryLockContext locks m only if it is free now.
func (m *Mutex) TryLockContext(ctx context.Context) error { return m.lock(ctx, 0) }

func (m *Mutex) lock(ctx context.Context, wait time.Duration) error {
	lease, err := m.locks.Hold(ctx, m.name, dlock.TTL(m.expiry), dlock.Wait(wait))
	if errors.Is(err, dlock.ErrNotAcquired) {
		return errors.Join(ErrFailed, err)
	}
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.lease = lease
	m.mu.Unlock()
	return nil
}

// Unlock releases m: true if it was still held.
func (m *Mutex) Unlock() (bool, error) { return m.UnlockContext(context.Background()) }

// UnlockContext releases m: true if it was still held; ErrLockAlreadyExpired if it was lost.
func (m *Mutex) UnlockContext(ctx context.Context) (bool, error) {
	m.mu.Lock()
	lease := m.lease
	m.lease = nil
	m.mu.Unlock()
	if lease == nil {
		return false, ErrLockAlreadyExpired
	}
	err := lease.Release(ctx)
	if errors.Is(err, dlock.ErrLeaseLost) {
		return false, errors.Join(ErrLockAlreadyExpired, err)
	}
	return err == nil, err
}

// Extend renews the lease now (it is renewed every ttl/3 anyway): true if renewed.
func (m *Mutex) Extend() (bool, error) { return m.ExtendContext(context.Background()) }

// ExtendContext renews the lease now: true if renewed.
func (m *Mutex) ExtendContext(ctx context.Context) (bool, error) {
	lease := m.current()
	if lease == nil {
		return false, ErrLockAlreadyExpired
	}
	renewed, err := lease.Renew(ctx)
	if err != nil || !renewed {
		return false, errors.Join(ErrExtendFailed, err)
	}
	return true, nil
}

// Valid says whether the lease still holds on the server (DLOCK.FENCECHECK of its fence).
func (m *Mutex) Valid() (bool, error) { return m.ValidContext(context.Background()) }

// ValidContext says whether the lease still holds on the server.
func (m *Mutex) ValidContext(ctx context.Context) (bool, error) {
	lease := m.current()
	if lease == nil {
		return false, nil
	}
	return lease.FenceCheck(ctx)
}
