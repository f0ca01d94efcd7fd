package kafka

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
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
	const lease = 2 * time.Second
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second),
		kfake.BrokerConfigs(map[string]string{
			"group.share.record.lock.duration.ms": "2000",
			"share.record.lock.sweep.interval.ms": "100",
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var mu sync.Mutex
	var sent [][]int64 // the offsets of each ShareAcknowledge request
	c.ControlKey(kmsg.ShareAcknowledge.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		offs := ackedOffsets(req)
		mu.Lock()
		sent = append(sent, offs)
		mu.Unlock()
		c.KeepControl()
		return nil, nil, false // observed only: kfake handles it
	})
	brokers := c.ListenAddrs()
	cfg := testConfig(t, brokers, 1)
	cfg.PollBatch = 2
	publishN(t, openSink(t, cfg), 2, func(int) string { return "k" })
	src := openShare(t, cfg)
	got := receiveN(t, src, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	early, late := got[0], got[1]
	if err := src.Ack(ctx, early); err != nil { // queued, sent with a later flush
		t.Fatal(err)
	}

	// late's lock now ends within half the lease.
	deadline := late.Handle.(*shareReceipt).r.AcquisitionDeadline()
	time.Sleep(time.Until(deadline.Add(-lease/2 + 100*time.Millisecond))) // the lock's clock has no signal
	if !src.Valid(late) {
		t.Fatal("setup: the lock ran out already")
	}
	mu.Lock()
	before := len(sent)
	mu.Unlock()
	if err := src.Ack(ctx, late); err != nil {
		t.Fatalf("Ack before the lock's end: %v", err)
	}
	mu.Lock()
	after := slices.Clone(sent[before:])
	mu.Unlock()
	if !slices.ContainsFunc(after, func(offs []int64) bool { return slices.Equal(offs, []int64{late.Offset}) }) {
		t.Fatalf("requests sent while Ack(offset %d) ran: %v; want one carrying that offset alone", late.Offset, after)
	}
}

// TestShareRenewalSentAtOnce: a renewal (the engine's heartbeat) reaches the
// broker at once, not with the source's next flush, a sixth of the lease
// later, nor after franz-go's own 1s wait for more acks; by then the lock
// may have run out.
func TestShareRenewalSentAtOnce(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
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
	// waits 1s, and to the source's flush 5s.
	wait := time.NewTimer(500 * time.Millisecond)
	defer wait.Stop()
	for {
		select {
		case offs := <-acked:
			if slices.Contains(offs, m.Offset) {
				t.Logf("renewal sent %v after ExtendLease", time.Since(start))
				return
			}
		case <-wait.C:
			t.Fatal("the renewal was not sent within 500ms of ExtendLease")
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
