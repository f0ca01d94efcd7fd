package kafka

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

// TestShareAckNearLockEndSentAlone: a status is sent some time after it is
// queued (with the source's next flush, up to a third of the lease later).
// One queued near the end of its record's lock could reach the broker after
// the lock, in a request with other records' statuses, and the broker,
// which applies a partition's statuses all or nothing, would refuse them
// all and deliver those records again. So a record settled within half the
// lease of its lock's end is acknowledged before Ack returns, in a request
// of its own.
func TestShareAckNearLockEndSentAlone(t *testing.T) {
	t.Parallel()
	src, acks := ackObservedShare(t, 2)
	got := receiveN(t, src, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	early, late := got[0], got[1]
	if err := src.Ack(ctx, early); err != nil { // queued, sent with a later flush
		t.Fatal(err)
	}
	// late's lock now ends within half the lease.
	deadline := late.Handle.(*shareReceipt).r.AcquisitionDeadline()
	time.Sleep(time.Until(deadline.Add(-observedLease/2 + 100*time.Millisecond))) // the lock's clock has no signal
	ackedAlone(ctx, t, src, late, acks)
}

// TestShareAckNearRenewedLockEndSentAlone: the same for a lock renewed by
// ExtendLease, which ends a lease after the renewal.
func TestShareAckNearRenewedLockEndSentAlone(t *testing.T) {
	t.Parallel()
	src, acks := ackObservedShare(t, 2)
	got := receiveN(t, src, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := src.Ack(ctx, got[0]); err != nil {
		t.Fatal(err)
	}
	m := got[1]
	renewed := time.Now()
	if err := src.ExtendLease(ctx, m, observedLease); err != nil {
		t.Fatal(err)
	}
	// Past the fetch-time deadline's half-lease mark, but the renewed lock
	// ends within half the lease only from here.
	time.Sleep(time.Until(renewed.Add(observedLease/2 + 100*time.Millisecond))) // the lock's clock has no signal
	ackedAlone(ctx, t, src, m, acks)
}

// observedLease is the record lock of ackObservedShare's broker.
const observedLease = 2 * time.Second

// ackObservedShare starts a kfake broker locking records for observedLease
// and a share source on a topic with n records (and a poll batch of n), and returns the source
// and a function returning the offsets of each ShareAcknowledge request the
// broker has received so far.
func ackObservedShare(t *testing.T, n int) (*ShareSource, func() [][]int64) {
	t.Helper()
	return ackObservedShareOn(t, leaseCluster(t), n)
}

// ackObservedShareOn is ackObservedShare on the broker c.
func ackObservedShareOn(t *testing.T, c *kfake.Cluster, n int) (*ShareSource, func() [][]int64) {
	t.Helper()
	var mu sync.Mutex
	var sent [][]int64
	c.ControlKey(kmsg.ShareAcknowledge.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		offs := ackedOffsets(req)
		mu.Lock()
		sent = append(sent, offs)
		mu.Unlock()
		c.KeepControl()
		return nil, nil, false // observed only: kfake handles it
	})
	cfg := testConfig(t, c.ListenAddrs(), 1)
	cfg.PollBatch = n
	publishN(t, openSink(t, cfg), n, func(int) string { return "k" })
	return openShare(t, cfg), func() [][]int64 {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(sent)
	}
}

// ackedAlone acks m, still valid, and checks that a request carrying m's
// offset alone reached the broker before Ack returned.
func ackedAlone(ctx context.Context, t *testing.T, src *ShareSource, m *ackwise.Message, acks func() [][]int64) {
	t.Helper()
	if !src.Valid(m) {
		t.Fatal("setup: the lock ran out already")
	}
	before := len(acks())
	if err := src.Ack(ctx, m); err != nil {
		t.Fatalf("Ack before the lock's end: %v", err)
	}
	requireSentAlone(t, m, acks()[before:])
}

// TestShareRenewalSentAtOnce: a renewal (the engine's heartbeat) reaches the
// broker at once, not with the source's next flush, a sixth of the lease
// later, nor after franz-go's own 1s wait for more acks; by then the lock
// may have run out.
func TestShareRenewalSentAtOnce(t *testing.T) {
	t.Parallel()
	c := newKfake(t)
	acked := make(chan []int64, 16)
	c.ControlKey(kmsg.ShareAcknowledge.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		offs := ackedOffsets(req)
		select {
		case acked <- offs:
		default:
		}
		c.KeepControl()
		return nil, nil, false
	})
	cfg := testConfig(t, c.ListenAddrs(), 1)
	publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })
	src := openShare(t, cfg) // the broker's default lock: 30s, so the source flushes every 5s
	m := receiveN(t, src, 1)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := src.ExtendLease(ctx, m, src.Capabilities().Lease); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// Sent at once it takes a few milliseconds; left to franz-go it
	// waits 1s (its timer starts when the renewal is queued), and to the
	// source's flush 5s. 800ms leaves room for a loaded machine (500ms
	// was exceeded once with the whole suite running under -race).
	wait := time.NewTimer(800 * time.Millisecond)
	defer wait.Stop()
	for {
		select {
		case offs := <-acked:
			if slices.Contains(offs, m.Offset) {
				t.Logf("renewal sent %v after ExtendLease", time.Since(start))
				return
			}
		case <-wait.C:
			t.Fatal("the renewal was not sent within 800ms of ExtendLease")
		}
	}
}

// ackedOffsets returns the offsets a ShareAcknowledge request carries.
func ackedOffsets(req kmsg.Request) []int64 {
	var offs []int64
	for _, tp := range req.(*kmsg.ShareAcknowledgeRequest).Topics {
		for _, p := range tp.Partitions {
			for _, b := range p.AcknowledgementBatches {
				for o := b.FirstOffset; o <= b.LastOffset; o++ {
					offs = append(offs, o)
				}
			}
		}
	}
	return offs
}

// TestShareDeadLetterNearLockEnd: a dead letter produced near the end of
// the record's lock, with the broker slow to confirm it, must not outlast
// the lock: the record would be released and delivered again beside its
// dead letter. DeadLetter renews the lock first.
func TestShareDeadLetterNearLockEnd(t *testing.T) {
	t.Parallel()
	c := leaseCluster(t)
	brokers := c.ListenAddrs()
	cfg := testConfig(t, brokers, 1)
	publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })
	src := openShare(t, cfg)
	m := receiveN(t, src, 1)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// The broker takes 1.5s to confirm the dead letter.
	c.ControlKey(kmsg.Produce.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.SleepControl(func() { time.Sleep(1500 * time.Millisecond) }) // the fault: a slow broker
		return nil, nil, false
	})
	deadline := m.Handle.(*shareReceipt).r.AcquisitionDeadline()
	time.Sleep(time.Until(deadline.Add(-observedLease/2 + 100*time.Millisecond))) // the lock's clock has no signal
	env := dlq.New(m, dlq.ReasonPermanent, errors.New("bad"), ackwise.ClassPermanent, time.Now(), "t", "v1")
	if err := src.DeadLetter(ctx, m, env); err != nil {
		t.Fatalf("DeadLetter with the lock held: %v", err)
	}
	if got := readAll(ctx, t, brokers, src.cfg.DeadLetterTopic); len(got) != 1 {
		t.Fatalf("%d dead letters, want 1", len(got))
	}
	wait, cancelWait := context.WithTimeout(ctx, observedLease+time.Second)
	defer cancelWait()
	buf := make([]*ackwise.Message, 1)
	if n, _ := src.Receive(wait, buf); n > 0 {
		t.Fatalf("the dead-lettered record came back (attempt %d): two copies", buf[0].Attempt)
	}
}

// leaseCluster starts a kfake broker that locks share records for
// observedLease and sweeps expired locks every 100ms.
func leaseCluster(t *testing.T) *kfake.Cluster {
	t.Helper()
	return leaseClusterOf(t, observedLease)
}

// leaseClusterOf is leaseCluster with records locked for lease.
func leaseClusterOf(t *testing.T, lease time.Duration) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second),
		kfake.BrokerConfigs(map[string]string{
			"group.share.record.lock.duration.ms": strconv.FormatInt(lease.Milliseconds(), 10),
			"share.record.lock.sweep.interval.ms": "100",
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestShareHeartbeatRoundFewRequests: the engine's heartbeat renews its
// messages one after another; a renewal does not wait for the round trip
// of the one before, so they go out in a few requests, not one each.
//
// The broker holds the first renewal's request until the whole round has
// been queued: each later ExtendLease must return while that round trip is
// still open (before, each waited behind the flusher's write lock for the round
// trip before it), and the rest of the round then goes in one or two more
// requests. No race with the scheduler: a round that waits for the held
// request only ends when the hold gives up, a generous holdMax later, and
// that is reported as the failure it is. The lock is long (2 minutes) so
// that the source's own flush gives up on the held request (after a sixth
// of it) only well after holdMax.
func TestShareHeartbeatRoundFewRequests(t *testing.T) {
	t.Parallel()
	const (
		n       = 10
		holdMax = 10 * time.Second
	)
	c := leaseClusterOf(t, 2*time.Minute)
	src, acks := ackObservedShareOn(t, c, n)
	msgs := receiveN(t, src, n)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before := len(acks())
	held := make(chan struct{})   // closed when the first request is held
	queued := make(chan struct{}) // closed once every renewal is queued
	var gaveUp atomic.Bool
	c.ControlKey(kmsg.ShareAcknowledge.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.DropControl() // holds the first request only
		close(held)
		c.SleepControl(func() {
			select {
			case <-queued:
			case <-time.After(holdMax):
				gaveUp.Store(true)
			}
		})
		return nil, nil, false
	})
	for i, m := range msgs {
		if err := src.ExtendLease(ctx, m, src.Capabilities().Lease); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			select {
			case <-held: // the first renewal's round trip is open
			case <-ctx.Done():
				t.Fatal("the first renewal never reached the broker")
			}
		}
	}
	close(queued)
	if gaveUp.Load() {
		t.Fatalf("the renewals were queued only after the broker answered the first (held %v): each waited for the round trip before it", holdMax)
	}
	want := map[int64]bool{}
	for _, m := range msgs {
		want[m.Offset] = true
	}
	for {
		reqs := acks()[before:]
		seen := 0
		for _, offs := range reqs {
			for _, o := range offs {
				if want[o] {
					seen++
				}
			}
		}
		if seen >= n {
			// The held request and the rest of the round in one more (a
			// third if a flush of the source's own came between): a few
			// requests, not one each.
			t.Logf("%d renewals in %d requests: %v", n, len(reqs), reqs)
			if len(reqs) > n/2 {
				t.Fatalf("%d renewals went out in %d requests: %v", n, len(reqs), reqs)
			}
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("renewals sent: %v; want all %d", reqs, n)
		}
		time.Sleep(10 * time.Millisecond) // polling the broker's view: no signal
	}
}

// TestShareAckWaitingForLocksNearLockEndSentAlone: a settle checks the lock's
// end, then waits for the source's locks (behind a sendAlone's or a renewal
// round's flushes, up to a third of the lease each). One that waited into
// the last half of the lease must still go alone: it used to be queued, and
// sent later with other records' statuses, which the broker refuses with it.
func TestShareAckWaitingForLocksNearLockEndSentAlone(t *testing.T) {
	t.Parallel()
	src, acks := ackObservedShare(t, 2)
	got := receiveN(t, src, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := src.Ack(ctx, got[0]); err != nil { // queued, sent with a later flush
		t.Fatal(err)
	}
	m := got[1]
	before := len(acks())
	src.ackMu.Lock() // as a sendAlone in progress holds it
	acked := make(chan error, 1)
	go func() { acked <- src.Ack(ctx, m) }() // far from the lock's end: passes the first check
	deadline := m.Handle.(*shareReceipt).r.AcquisitionDeadline()
	time.Sleep(time.Until(deadline.Add(-observedLease/2 + 100*time.Millisecond))) // the lock's clock has no signal
	src.ackMu.Unlock()
	if err := <-acked; err != nil {
		t.Fatalf("Ack before the lock's end: %v", err)
	}
	requireSentAlone(t, m, acks()[before:])
}

// requireSentAlone checks that one of the requests sent while m was acked
// carried m's offset alone.
func requireSentAlone(t *testing.T, m *ackwise.Message, sent [][]int64) {
	t.Helper()
	if !slices.ContainsFunc(sent, func(offs []int64) bool { return slices.Equal(offs, []int64{m.Offset}) }) {
		t.Fatalf("requests sent while Ack(offset %d) ran: %v; want one carrying that offset alone", m.Offset, sent)
	}
}
