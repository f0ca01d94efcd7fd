package kafka

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

func openShare(t *testing.T, cfg SourceConfig) *ShareSource {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := NewShareSource(ctx, shareOf(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestShareGroupAcceptReleaseDeadLetter: per-record accept, release (the
// record comes back with its delivery count as Attempt) and dead-letter on
// a share group; nothing is accepted before it is settled.
func TestShareGroupAcceptReleaseDeadLetter(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	sink := openSink(t, cfg)
	in := publishN(t, sink, 10, func(i int) string { return "k" })
	src := openShare(t, cfg)
	if caps := src.Capabilities(); !caps.DeliveryCount || caps.Delay || caps.Log || caps.Ordered {
		t.Fatalf("capabilities %+v", caps)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := receiveN(t, src, 10)
	for i, m := range got {
		if m.ID != in[i].ID || m.Attempt != 1 || !src.Valid(m) {
			t.Fatalf("delivery %d: %+v", i, m)
		}
	}
	// With everything handed out and nothing settled, Receive waits instead
	// of polling (which would accept the unsettled records).
	short, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	if n, err := src.Receive(short, make([]*ackwise.Message, 4)); n != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive with every record unsettled returned %d, %v; want to wait", n, err)
	}
	scancel()
	for _, m := range got[:8] {
		if err := src.Ack(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := src.Ack(ctx, got[0]); err == nil {
		t.Fatal("second ack accepted")
	}
	if err := src.Release(ctx, got[8]); err != nil {
		t.Fatal(err)
	}
	env := dlq.New(got[9], dlq.ReasonPermanent, errors.New("bad"), ackwise.ClassPermanent, time.Now(), "billing", "")
	if err := src.DeadLetter(ctx, got[9], env); err != nil {
		t.Fatal(err)
	}
	again := receiveN(t, src, 1)[0]
	if again.ID != in[8].ID || again.Attempt != 2 {
		t.Fatalf("after release got %s attempt %d, want %s attempt 2", again.ID, again.Attempt, in[8].ID)
	}
	if err := src.Ack(ctx, again); err != nil {
		t.Fatal(err)
	}
	dls := readAll(ctx, t, brokers, cfg.Topic+".dlq")
	if len(dls) != 1 || recordMessage(dls[0]).ID != in[9].ID || recordMessage(dls[0]).Headers.Get(dlq.HeaderReason) != "permanent" {
		t.Fatalf("dead letters %v", dls)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if err := src.Ack(ctx, again); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("ack after close: %v", err)
	}
	// A new member of the group gets only what comes next: all ten were
	// settled.
	next := publishN(t, sink, 1, func(int) string { return "k" })
	next[0].ID = "ev-0" // publishN numbers from 0 again
	src2 := openShare(t, cfg)
	m := receiveN(t, src2, 1)[0]
	if m.Offset != 10 {
		t.Fatalf("new member got offset %d (%s), want the new record at 10", m.Offset, m.ID)
	}
}

// TestShareReleaseAfterRenewedLockRedelivers: a record whose lock the engine
// renewed (ExtendLease) past the lock granted at fetch time is still this
// member's. Releasing it must hand it back; before the fix the source sent
// no ack for it (it judged the lock expired by the fetch-time deadline) and
// franz-go's next poll auto-accepted it: the record was lost unhandled.
func TestShareReleaseAfterRenewedLockRedelivers(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second),
		kfake.BrokerConfigs(map[string]string{"group.share.record.lock.duration.ms": "1000", "share.record.lock.sweep.interval.ms": "100"}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	cfg := testConfig(t, brokers, 1)
	in := publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })[0]
	src := openShare(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m := receiveN(t, src, 1)[0]
	fetchDeadline := m.Handle.(*shareReceipt).r.AcquisitionDeadline()
	// A handler longer than the lock, renewing it as the engine's heartbeat
	// does (the sleeps are the handler's own work, not a wait for an event).
	for time.Now().Before(fetchDeadline.Add(300 * time.Millisecond)) {
		if err := src.ExtendLease(ctx, m, time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(150 * time.Millisecond)
	}
	if !src.Valid(m) {
		t.Error("renewed record reported invalid after its fetch-time lock deadline")
	}
	if err := src.Release(ctx, m); err != nil {
		t.Fatalf("release of a renewed record: %v", err)
	}
	got := receiveN(t, src, 1)[0]
	if got.ID != in.ID || got.Attempt != 2 {
		t.Fatalf("after release got %s attempt %d, want %s attempt 2", got.ID, got.Attempt, in.ID)
	}
	if err := src.Ack(ctx, got); err != nil {
		t.Fatal(err)
	}
}

// TestShareStartOffsetLatestApplies: StartOffset "latest" is written to the
// group's share.auto.offset.reset like "earliest" is; before, a group once
// opened with "earliest" kept it and "latest" was silently ignored.
func TestShareStartOffsetLatestApplies(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	for _, want := range []string{"earliest", "latest"} {
		cfg.StartOffset = want
		src := openShare(t, cfg)
		if err := src.Close(); err != nil {
			t.Fatal(err)
		}
		if got := shareAutoOffsetReset(t, brokers, cfg.Group); got != want {
			t.Fatalf("StartOffset %q: group share.auto.offset.reset = %q", want, got)
		}
	}
}

func shareAutoOffsetReset(t *testing.T, brokers []string, group string) string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	res.ConfigNames = []string{"share.auto.offset.reset"}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.Resources {
		for _, c := range r.Configs {
			if c.Name == "share.auto.offset.reset" && c.Value != nil {
				return *c.Value
			}
		}
	}
	return ""
}

// TestShareLeaseFromBrokerAndGroupConfig: the share source's lease (what the
// engine heartbeats against) is the record lock the broker applies: the
// broker's group.share.record.lock.duration.ms, overridden by the group's
// share.record.lock.duration.ms; 30s by default.
func TestShareLeaseFromBrokerAndGroupConfig(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second),
		kfake.BrokerConfigs(map[string]string{"group.share.record.lock.duration.ms": "12000"}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	cfg := testConfig(t, brokers, 1)
	if got := openShare(t, cfg).Capabilities().Lease; got != 12*time.Second {
		t.Fatalf("lease %v with the broker's lock at 12s", got)
	}

	// A group-level override wins.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg2 := cfg
	cfg2.Group = uniq("share-g")
	SetShareLockForTest(ctx, t, brokers, cfg2.Group, 9*time.Second)
	if got := openShare(t, cfg2).Capabilities().Lease; got != 9*time.Second {
		t.Fatalf("lease %v with the group's lock at 9s", got)
	}

	// Nothing configured: the broker default.
	if got := openShare(t, testConfig(t, newCluster(t), 1)).Capabilities().Lease; got != DefaultShareLease {
		t.Fatalf("lease %v with no configuration, want %v", got, DefaultShareLease)
	}
}
