package outbox_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/producer"
	"github.com/ackwise/ackwise/producer/outbox"
	"github.com/ackwise/ackwise/producer/outbox/sqliteoutbox"
	"github.com/ackwise/ackwise/retry"
)

func TestNewRelayValidates(t *testing.T) {
	t.Parallel()
	broker, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sink, err := broker.Sink("q")
	if err != nil {
		t.Fatal(err)
	}
	var store outbox.Store = &sqliteoutbox.Store{}
	for _, tc := range []struct {
		name string
		cfg  outbox.Config
		want string
	}{
		{"negative batch", outbox.Config{BatchSize: -1}, "negative"},
		{"publish timeout over half the lease", outbox.Config{Lease: time.Second, PublishTimeout: 600 * time.Millisecond}, "PublishTimeout"},
		{"retention below -1", outbox.Config{Retention: -2}, "Retention"},
		{"bad row retry", outbox.Config{RowRetry: retry.Policy{Multiplier: 0.5}}, "RowRetry"},
		{"publisher without end", outbox.Config{Publish: producer.Config{Retry: retry.Policy{MaxAttempts: retry.Unlimited}}}, "Publish"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := outbox.NewRelay(store, sink, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewRelay(%+v) = %v, want an error naming %s", tc.cfg, err, tc.want)
			}
		})
	}
	if _, err := outbox.NewRelay(nil, sink, outbox.Config{}); err == nil {
		t.Error("NewRelay(nil store) did not fail")
	}
	if _, err := outbox.NewRelay(store, nil, outbox.Config{}); err == nil {
		t.Error("NewRelay(nil sink) did not fail")
	}
	r, err := outbox.NewRelay(store, sink, outbox.Config{Owner: "relay-a"})
	if err != nil || r.Owner() != "relay-a" {
		t.Fatalf("NewRelay = %v, %v", r, err)
	}
}
