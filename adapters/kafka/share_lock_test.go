package kafka

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

// TestSharePendingRecordsKeepTheirLock: records a share source polled but
// has not handed out yet are locked to it by the broker, and the engine only
// renews what it received. The source used to leave their locks to run out
// behind a handler slower than the lock: the engine then found them invalid
// and released them, the broker counted a delivery each time, and at
// share.delivery.count.limit archived a record no handler ever saw. No
// handler fails here, so every record must be handled, at attempt 1.
func TestSharePendingRecordsKeepTheirLock(t *testing.T) {
	t.Parallel()
	brokers := shortLockCluster(t, "1500", "2")
	cfg := testConfig(t, brokers, 1)
	in := publishN(t, openSink(t, cfg), 3, func(int) string { return "k" })
	src := openShare(t, cfg)

	var mu sync.Mutex
	handled := map[string]int{} // event ID -> attempt seen by the handler
	all := make(chan struct{})
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		time.Sleep(2 * time.Second) // a handler longer than the 1.5s lock (the engine renews it)
		mu.Lock()
		defer mu.Unlock()
		handled[m.ID] = m.Attempt
		if len(handled) == len(in) {
			select {
			case <-all:
			default:
				close(all)
			}
		}
		return nil
	})
	cons, err := consumer.New(src, h, consumer.Config{Concurrency: 1, MaxInFlight: 1, DrainTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx) }()
	select {
	case <-all:
	case <-time.After(15 * time.Second):
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	for _, m := range in {
		a, ok := handled[m.ID]
		switch {
		case !ok:
			t.Errorf("%s was never handled (archived by the broker after its lock ran out while pending)", m.ID)
		case a != 1:
			t.Errorf("%s handled at attempt %d, want 1: its attempts were spent while it sat undelivered in the source", m.ID, a)
		}
	}
}

// TestShareDeadLetterAfterLockExpired: a record whose lock ran out is the
// broker's to redeliver, so DeadLetter must not write a dead letter for it
// (that would be a second copy beside the redelivered record): it releases
// it and reports the receipt invalid.
func TestShareDeadLetterAfterLockExpired(t *testing.T) {
	t.Parallel()
	brokers := shortLockCluster(t, "1000", "5")
	cfg := testConfig(t, brokers, 1)
	publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })
	src := openShare(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	buf := make([]*ackwise.Message, 1)
	if n, err := src.Receive(ctx, buf); n != 1 || err != nil {
		t.Fatalf("Receive = %d, %v", n, err)
	}
	m := buf[0]
	// The lock's deadline is what this test is about: wait it out.
	time.Sleep(time.Until(m.Handle.(*shareReceipt).r.AcquisitionDeadline()) + 50*time.Millisecond)
	if src.Valid(m) {
		t.Fatal("Valid after the lock's deadline")
	}
	env := dlq.New(m, dlq.ReasonPermanent, errors.New("bad"), ackwise.ClassPermanent, time.Now(), "t", "v1")
	if err := src.DeadLetter(ctx, m, env); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("DeadLetter of a record whose lock ran out = %v, want ErrReceiptInvalid", err)
	}
	if got := readAll(ctx, t, brokers, src.cfg.DeadLetterTopic); len(got) != 0 {
		t.Fatalf("%d dead letters for a record the broker redelivers", len(got))
	}
}

// shortLockCluster starts a kfake broker whose share groups lock a record
// for lockMs milliseconds and archive it after limit deliveries.
func shortLockCluster(t *testing.T, lockMs, limit string) []string {
	t.Helper()
	return shortLockKfake(t, lockMs, limit).ListenAddrs()
}

// shortLockKfake is shortLockCluster's broker itself, for tests that
// observe its requests, with opts added.
func shortLockKfake(t *testing.T, lockMs, limit string, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second),
		kfake.BrokerConfigs(map[string]string{
			"group.share.record.lock.duration.ms": lockMs,
			"share.record.lock.sweep.interval.ms": "100",
			"group.share.delivery.count.limit":    limit,
		})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// fetchedAhead stands in for the fetch franz-go can make ahead of the
// source's next poll: it polls n records with the source's client and
// returns them once their locks ran out, margin ago (the locks' deadlines
// are what the callers test: there is no signal to wait for).
func fetchedAhead(ctx context.Context, t *testing.T, src *ShareSource, n int, margin time.Duration) []*kgo.Record {
	t.Helper()
	var recs []*kgo.Record
	for len(recs) < n {
		fs := src.Client().PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("polled %d records: %v", len(recs), err)
		}
		recs = append(recs, fs.Records()...)
	}
	time.Sleep(time.Until(recs[len(recs)-1].AcquisitionDeadline()) + margin)
	return recs
}

// TestShareStaleBufferedRecordsNotDelivered: franz-go can grant one more
// share fetch while a poll returns, and its records wait in the client's
// buffer, locked, with nobody renewing them, until the source polls again.
// A record whose lock ran out meanwhile must not be handed to a handler
// (the broker may have given it to another member): the source releases
// it and delivers it when the broker does again, at its next attempt. The
// test takes the place of that fetch: it polls the source's client itself
// and files the records as the source's next poll would.
func TestShareStaleBufferedRecordsNotDelivered(t *testing.T) {
	t.Parallel()
	brokers := shortLockCluster(t, "1000", "5")
	cfg := testConfig(t, brokers, 1)
	publishN(t, openSink(t, cfg), 2, func(int) string { return "k" })
	src := openShare(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	recs := fetchedAhead(ctx, t, src, 2, 50*time.Millisecond)
	filePolled(src, recs)
	requireRedeliveredOnly(ctx, t, src, "in the client's buffer")
}

// TestShareRenewalSkipsExpiredPendingRecords: the source renews the locks
// of the records it holds back. A record franz-go fetched ahead can reach
// them with its lock already run out (see
// TestShareStaleBufferedRecordsNotDelivered). Renewing it is refused by the
// broker (with every other status of its partition in that request), and
// the source used to count it renewed all the same: the record then looked
// locked and was handed to a handler at attempt 1 while the broker had
// already released it. It must be released instead, and delivered when the
// broker delivers it again.
func TestShareRenewalSkipsExpiredPendingRecords(t *testing.T) {
	t.Parallel()
	c := shortLockKfake(t, "1000", "5")
	brokers := c.ListenAddrs()
	cfg := testConfig(t, brokers, 1)
	publishN(t, openSink(t, cfg), 2, func(int) string { return "k" })
	src := openShare(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	// Past the locks' deadlines and the broker's sweep of them (every
	// 100ms).
	recs := fetchedAhead(ctx, t, src, 2, 400*time.Millisecond)
	sent := make(chan []int64, 16)
	c.ControlKey(kmsg.ShareAcknowledge.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		select {
		case sent <- ackedOffsets(req):
		default:
		}
		c.KeepControl()
		return nil, nil, false // observed only: kfake handles it
	})
	filePolled(src, recs)
	// The source's next renewal round finds them pending.
	select {
	case src.flushNow <- struct{}{}:
	default:
	}
	for seen := false; !seen; {
		select {
		case offs := <-sent:
			seen = slices.Contains(offs, recs[0].Offset)
		case <-ctx.Done():
			t.Fatal("the pending records were neither renewed nor released")
		}
	}
	requireRedeliveredOnly(ctx, t, src, "while pending (the renewal was refused)")
}

// TestShareFetchedAheadShortLockRenewed: a record franz-go fetched ahead
// can reach Receive with little of its lock left (it waited, unrenewed, in
// the client's buffer while the previous poll's records were handled). The
// engine renews a delivery a third to two thirds of the lease after it, too
// late for such a record: the source renews it before handing it out.
func TestShareFetchedAheadShortLockRenewed(t *testing.T) {
	t.Parallel()
	brokers := shortLockCluster(t, "1000", "5")
	cfg := testConfig(t, brokers, 1)
	publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })
	src := openShare(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	recs := fetchedAhead(ctx, t, src, 1, -250*time.Millisecond) // a quarter of the lock left
	filePolled(src, recs)
	buf := make([]*ackwise.Message, 1)
	if n, err := src.Receive(ctx, buf); n != 1 || err != nil {
		t.Fatalf("Receive = %d, %v", n, err)
	}
	m := buf[0]
	if m.Attempt != 1 {
		t.Fatalf("delivered at attempt %d, want 1 (its lock had not run out)", m.Attempt)
	}
	// Past the fetch-time deadline (and the broker's sweep of it): the
	// renewed lock still holds.
	time.Sleep(time.Until(recs[0].AcquisitionDeadline()) + 300*time.Millisecond)
	if !src.Valid(m) {
		t.Fatal("Valid false past the fetch-time deadline: the lock was not renewed before delivery")
	}
	if err := src.Ack(ctx, m); err != nil {
		t.Fatalf("Ack after the fetch-time deadline: %v", err)
	}
}

// filePolled files recs as the source's next poll would have taken them.
func filePolled(src *ShareSource, recs []*kgo.Record) {
	src.mu.Lock()
	src.pending, src.outstanding = recs, len(recs)
	src.mu.Unlock()
}

// requireRedeliveredOnly receives from src and fails the test if a record
// whose lock ran out (where says where) is handed out at attempt 1: it
// must be released, and delivered again at attempt 2 or later.
func requireRedeliveredOnly(ctx context.Context, t *testing.T, src *ShareSource, where string) {
	t.Helper()
	buf := make([]*ackwise.Message, 2)
	n, err := src.Receive(ctx, buf)
	if err != nil || n == 0 {
		t.Fatalf("Receive = %d, %v", n, err)
	}
	for _, m := range buf[:n] {
		if m.Attempt < 2 {
			t.Fatalf("%s delivered at attempt %d after its lock ran out %s; want it released and delivered again", m.BrokerID, m.Attempt, where)
		}
	}
}
