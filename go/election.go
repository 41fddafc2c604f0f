package dlock

import (
	"context"
	"errors"
	"time"
)

// observeInterval: an observer reads DLOCK.INFO this often besides on every message (a DEL or
// RENAME of the key publishes nothing).
const observeInterval = 5 * time.Second

// Campaign waits until this candidate leads the election name, then returns the leadership as
// an exclusive lease whose META is address (what Observe shows of the leader); its Fence is the
// term's epoch, larger for every newer term: send it with the leader's writes. It waits in rounds
// of 30 s, each with a fresh token, until ctx ends (or the Wait option, when given to New or to
// Campaign, passes). Default ttl 10 s, unless New or Campaign is given a TTL. Resign with
// lease.Release (or Resign); a crashed leader is replaced once its ttl runs out.
func (l *Locks) Campaign(ctx context.Context, name, address string, opts ...Option) (*Lease, error) {
	// A campaign's own defaults (ttl 10 s, no limit on the wait), then New's options, then the
	// call's: an option given to New is the default of every call, campaigns included.
	set := defaults()
	set.ttl, set.wait = 10*time.Second, -1
	for _, opt := range append(append([]Option(nil), l.opts...), opts...) {
		opt(&set)
	}
	set.meta, set.hasMeta = address, true
	var until time.Time
	if set.wait >= 0 {
		until = time.Now().Add(set.wait)
	}
	for {
		round := set
		round.wait = campaignRound
		if !until.IsZero() {
			round.wait = min(campaignRound, max(0, time.Until(until)))
		}
		lease, err := l.acquire(ctx, name, mode{}, round)
		if err == nil || !errors.Is(err, ErrNotAcquired) || ctx.Err() != nil ||
			(!until.IsZero() && !time.Now().Before(until)) {
			return lease, err
		}
	}
}

// Resign gives the leadership up: the same as Release.
func (l *Lease) Resign(ctx context.Context) error { return l.Release(ctx) }

// Observe reports the leaders of the election name as they change: first the one leading now,
// then each new one, nil while nobody leads. It reads DLOCK.INFO on every message of the name's
// channel, on every (re)subscription and every 5 s. The channel is closed when ctx ends.
func (l *Locks) Observe(ctx context.Context, name string) <-chan *Leader {
	leaders := make(chan *Leader)
	go func() {
		defer close(leaders)
		if l.err != nil {
			return
		}
		defer l.router.use()()
		var (
			last  *Leader
			first = true
		)
		// The subscription follows the name's slot; every resubscription wakes the observer.
		w := l.router.channels.join(ctx, name, "", l.set.requestTimeout)
		defer l.router.channels.leave(w)
		for ctx.Err() == nil {
			reply, err := l.router.do(ctx, name, l.set.requestTimeout, infoArgs(name)...)
			if err == nil {
				leader, parseErr := leaderFromInfo(reply)
				if parseErr == nil && (first || !sameLeader(leader, last)) {
					select {
					case leaders <- leader:
					case <-ctx.Done():
						return
					}
					first, last = false, leader
				}
			}
			timer := time.NewTimer(observeInterval)
			select {
			case <-w.wake:
			case <-timer.C:
			case <-ctx.Done():
			}
			timer.Stop()
		}
	}()
	return leaders
}

func sameLeader(a, b *Leader) bool {
	if a == nil || b == nil {
		return a == b
	}
	sameAddress := (a.Address == nil) == (b.Address == nil) && (a.Address == nil || *a.Address == *b.Address)
	return a.Fence == b.Fence && a.Token == b.Token && sameAddress
}
