package kafka

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ackwise/ackwise"
)

// TestReleasedRecordGoneKeepsRecordsOfPollInFlight: a released record is
// gone from the log (retention) when the partition is rewound to it, while
// the receiving goroutine waits in a poll begun before the rewind. That
// poll returns what the rewound fetch brings: records already delivered,
// then new ones. The poll began before the rewind, so its new records are
// held back as if fetched before it; but they were fetched after it, and
// nothing fetches them again. Before, the next poll, taken for the proof
// that the released record is gone, went on past them: they were never
// delivered and their offsets were committed.
func TestReleasedRecordGoneKeepsRecordsOfPollInFlight(t *testing.T) {
	t.Parallel()
	c := newKfake(t)
	brokers := c.ListenAddrs()
	cfg := testConfig(t, brokers, 1)
	// Fetches waiting for records come back soon, so that the one in
	// flight when fetches are held (below) is soon one held.
	cfg.Options = []kgo.Opt{kgo.FetchMaxWait(50 * time.Millisecond)}
	var hold atomic.Bool
	held := make(chan struct{}, 1)
	gate := make(chan struct{})
	c.ControlKey(kmsg.Fetch.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		if hold.Load() {
			select {
			case held <- struct{}{}:
			default:
			}
			c.SleepControl(func() { <-gate })
		}
		return nil, nil, false
	})
	sink := openSink(t, cfg)
	publishN(t, sink, 2, func(int) string { return "k" })
	src := openSource(t, cfg)
	msgs := receiveN(t, src, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Retention deletes the first record while it is in flight.
	dr, err := kadm.NewClient(src.Client()).DeleteRecords(ctx, kadm.Offsets{cfg.Topic: {0: {At: 1}}})
	if err == nil {
		err = dr.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	// From here the broker holds fetches: the records published next are
	// fetched only after the rewind.
	hold.Store(true)
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("no fetch held")
	}
	publishN(t, sink, 2, func(int) string { return "k" }) // offsets 2 and 3
	src.mu.Lock()
	before := src.polls
	src.mu.Unlock()
	type result struct {
		offs []int64
		err  error
	}
	got := make(chan result, 1)
	go func() {
		var r result
		for !slices.Contains(r.offs, 4) && r.err == nil {
			buf := make([]*ackwise.Message, 8)
			var n int
			n, r.err = src.Receive(ctx, buf)
			for _, m := range buf[:n] {
				r.offs = append(r.offs, m.Offset)
			}
		}
		got <- r
	}()
	// The receiving goroutine waits in its poll (no signal for that: the
	// poll count is watched).
	for {
		src.mu.Lock()
		polling := src.polls > before
		src.mu.Unlock()
		if polling {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("Receive did not poll")
		case <-time.After(time.Millisecond):
		}
	}
	if err := src.Release(ctx, msgs[0]); err != nil {
		t.Fatal(err)
	}
	hold.Store(false)
	close(gate)
	publishN(t, sink, 1, func(int) string { return "k" }) // offset 4
	r := <-got
	if r.err != nil {
		t.Fatalf("after offsets %v: %v", r.offs, r.err)
	}
	if want := []int64{2, 3, 4}; !slices.Equal(r.offs, want) {
		t.Fatalf("offsets delivered %v, want %v: records fetched after the rewind were lost", r.offs, want)
	}
}
