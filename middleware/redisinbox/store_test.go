package redisinbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/inboxtest"
	"github.com/ackwise/ackwise/middleware/redisinbox"
)

func redisAddr() string {
	if a := os.Getenv("ACKWISE_TEST_REDIS"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// connect returns a client, failing the test (skipping it under -short) when
// Redis cannot be reached.
func connect(t testing.TB) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		if testing.Short() {
			t.Skipf("Redis unreachable with -short: %v", err)
		}
		t.Fatalf("Redis at %s unreachable (start it, or set ACKWISE_TEST_REDIS): %v", redisAddr(), err)
	}
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// newStore returns a Store under a unique key prefix whose keys are deleted
// when the test ends.
func newStore(t testing.TB, cfg redisinbox.Config) (*redisinbox.Store, *redis.Client) {
	t.Helper()
	rdb := connect(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	cfg.Prefix = "ackwise-test:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, cfg.Prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("cleanup scan: %v", err)
		}
	})
	s, err := redisinbox.New(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, rdb
}

func TestInboxConformance(t *testing.T) {
	s, _ := newStore(t, redisinbox.Config{})
	inboxtest.RunInbox(t, func(t *testing.T) middleware.InboxStore { return s }, inboxtest.Options{NonBlocking: true})
}

func msgFor(id string) *ackwise.Message {
	return &ackwise.Message{ID: id, Partition: -1, Offset: -1, Attempt: 1}
}

func TestDoneRecordLivesForRetention(t *testing.T) {
	t.Parallel()
	s, rdb := newStore(t, redisinbox.Config{LockTTL: time.Minute, Retention: 3 * time.Hour})
	key := middleware.InboxKey{Consumer: "mailer", EventID: "e1"}
	c, ok, err := s.ClaimEvent(t.Context(), key)
	if err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	if ttl := rdb.PTTL(t.Context(), s.Key(key)).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("in-progress lock TTL %v, want (0, 1m]", ttl)
	}
	if err := c.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(t.Context(), s.Key(key)).Val(); ttl <= 2*time.Hour || ttl > 3*time.Hour {
		t.Fatalf("done record TTL %v, want about 3h", ttl)
	}
	if ok, err := s.Handled(t.Context(), key); !ok || err != nil {
		t.Fatalf("Handled = %v, %v", ok, err)
	}
}

// TestCrashedClaimExpires: a consumer that dies holding the lock (before its
// handler finished) blocks redeliveries only until LockTTL; then the event is
// handled — which is the documented window for a second external call.
func TestCrashedClaimExpires(t *testing.T) {
	t.Parallel()
	// Long enough that the lock is still held when the delivery below
	// comes, however slowly a busy machine gets there.
	const ttl = 2 * time.Second
	s, _ := newStore(t, redisinbox.Config{LockTTL: ttl})
	key := middleware.InboxKey{Consumer: "mailer", EventID: "e1"}
	if _, ok, err := s.ClaimEvent(t.Context(), key); !ok || err != nil { // never committed: the crash
		t.Fatalf("claim: %v %v", ok, err)
	}
	var runs atomic.Int32
	mw, err := middleware.Inbox(s, middleware.InboxConfig{Consumer: "mailer"})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { runs.Add(1); return nil }))
	err = h.Handle(t.Context(), msgFor("e1"))
	d, retry := ackwise.RetryAfterOf(err)
	if !errors.Is(err, redisinbox.ErrInProgress) || !retry || d <= 0 || d > ttl {
		t.Fatalf("delivery while locked: %v (retry after %v); want ErrInProgress with a delay within the lock TTL", err, d)
	}
	// Redeliver after the delay the error asked for, as the engine would.
	deadline := time.Now().Add(30 * time.Second) // a hang detector: generous on a busy machine
	for {
		time.Sleep(d)
		err = h.Handle(t.Context(), msgFor("e1"))
		if d, retry = ackwise.RetryAfterOf(err); !retry {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("lock never expired")
		}
	}
	if err != nil || runs.Load() != 1 {
		t.Fatalf("after the lock expired: err %v, runs %d; want nil and 1", err, runs.Load())
	}
}

func TestRollbackKeepsAnotherClaimsLock(t *testing.T) {
	t.Parallel()
	// The expiry is stood in for below: the fresh claim's lock must not
	// run out on its own before the check, however slow the machine.
	s, rdb := newStore(t, redisinbox.Config{LockTTL: time.Minute})
	key := middleware.InboxKey{Consumer: "c", EventID: "e"}
	stale, ok, err := s.ClaimEvent(t.Context(), key)
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	// The stale claim's lock expires (its handler overran LockTTL) and a
	// redelivery claims the event; the stale claim's rollback must not
	// release the new claim's lock.
	if err := rdb.Del(t.Context(), s.Key(key)).Err(); err != nil { // stands in for the expiry
		t.Fatal(err)
	}
	fresh, ok, err := s.ClaimEvent(t.Context(), key)
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := stale.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.ClaimEvent(t.Context(), key); ok || !errors.Is(err, redisinbox.ErrInProgress) {
		t.Fatalf("after a stale rollback the fresh claim's lock is gone (claimed %v, err %v)", ok, err)
	}
	if err := fresh.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestKeysDoNotCollide(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer rdb.Close()
	s, err := redisinbox.New(rdb, redisinbox.Config{Prefix: "p:"})
	if err != nil {
		t.Fatal(err)
	}
	a := s.Key(middleware.InboxKey{Consumer: "a:b", EventID: "c"})
	b := s.Key(middleware.InboxKey{Consumer: "a", EventID: "b:c"})
	if a == b {
		t.Fatalf("keys collide: %q", a)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer rdb.Close()
	for _, tc := range []struct {
		cfg  redisinbox.Config
		want string
	}{
		{redisinbox.Config{LockTTL: -time.Second}, "Config.LockTTL -1s"},
		{redisinbox.Config{Retention: time.Microsecond}, "Config.Retention 1µs"},
	} {
		if _, err := redisinbox.New(rdb, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v): %v, want an error containing %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := redisinbox.New(nil, redisinbox.Config{}); err == nil {
		t.Error("New(nil): no error")
	}
}

// TestEngineAppliesEachEventOnceUnderFaults runs inboxtest.RunEngine with an
// effect in another system (a count in memory) that the handler applies only
// when it succeeds: the store marks success, it does not roll effects back.
// Its promise is that the engine's duplicates, lost acks and crashes before
// the ack never run a succeeded event again. The lock lives far longer than
// a handler runs (the documented condition), and short enough that a
// duplicate arriving while its twin runs (told to retry after the lock's
// remaining time) would not stall the test.
func TestEngineAppliesEachEventOnceUnderFaults(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redisinbox.Config{LockTTL: time.Second})
	inboxtest.RunEngine(t, inboxtest.Engine{Store: s, Handled: s.Handled})
}
