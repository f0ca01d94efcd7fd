package kafka

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
)

// TestBrokerRestartLosesNothing kills the broker (a kfake process with a
// data dir) with SIGKILL while a consumer is working, starts it again on
// the same dir and port, and checks that every record published before and
// after is handled.
func TestBrokerRestartLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess broker test (-short)")
	}
	t.Parallel()
	port := freePort(t)
	dir := t.TempDir()
	env := []string{childEnv + "=kfake", "KFAKE_PORT=" + strconv.Itoa(port), "KFAKE_DIR=" + dir}
	broker, addr := startChild(t, env...)
	brokers := []string{addr}
	cfg := testConfig(t, brokers, 3)
	cfg.Options = fastGroup
	sink := openSink(t, cfg)
	const n = 300
	round := func(r string) []*ackwise.Message {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		msgs := make([]*ackwise.Message, n)
		for i := range msgs {
			msgs[i] = &ackwise.Message{ID: fmt.Sprintf("%s-%d", r, i), Key: "k" + strconv.Itoa(i%17), Payload: []byte(strconv.Itoa(i))}
		}
		if err := sink.Publish(ctx, msgs...); err != nil {
			t.Fatalf("publish round %s: %v", r, err)
		}
		return msgs
	}
	first := round("before")
	src := openSource(t, cfg)
	var mu sync.Mutex
	seen := map[string]int{}
	changed := make(chan struct{}, 1)
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		time.Sleep(200 * time.Microsecond)
		mu.Lock()
		seen[m.ID]++
		seen["n"]++
		mu.Unlock()
		select {
		case changed <- struct{}{}:
		default:
		}
		return nil
	})
	c, err := consumer.New(src, h, consumer.Config{Concurrency: 8})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-runDone; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitSeen := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.After(40 * time.Second)
		for {
			mu.Lock()
			ok := cond()
			mu.Unlock()
			if ok {
				return
			}
			select {
			case <-changed:
			case <-deadline:
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitSeen("some handled", func() bool { return seen["n"] >= n/10 })
	kill9(t, broker)
	startChild(t, env...)
	second := round("after")
	handled := func(ms []*ackwise.Message) bool {
		for _, m := range ms {
			if seen[m.ID] == 0 {
				return false
			}
		}
		return true
	}
	waitSeen("every record of both rounds", func() bool { return handled(first) && handled(second) })
}
