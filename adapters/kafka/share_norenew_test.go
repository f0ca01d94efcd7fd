package kafka

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/ackwise/ackwise"
)

// TestShareWithoutLockRenewal: brokers before Kafka 4.2 cannot renew a
// share lock (KIP-1222 came with ShareAcknowledge v2). The source says so:
// Capabilities has no ExtendLease (the engine runs no heartbeat),
// ExtendLease fails, and the source sends no renewals of the records it
// holds back. Before, it reported ExtendLease and took every renewal as
// held: Valid and the near-expiry checks reckoned locks from renewals the
// broker never made.
func TestShareWithoutLockRenewal(t *testing.T) {
	t.Parallel()
	c := shortLockKfake(t, "1000", "5", kfake.MaxVersions(kversion.V4_1_0()))
	var mu sync.Mutex
	var types []int8 // every status the broker was sent
	c.ControlKey(kmsg.ShareAcknowledge.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		mu.Lock()
		for _, tp := range req.(*kmsg.ShareAcknowledgeRequest).Topics {
			for _, p := range tp.Partitions {
				for _, b := range p.AcknowledgementBatches {
					types = append(types, b.AcknowledgeTypes...)
				}
			}
		}
		mu.Unlock()
		return nil, nil, false // observed only: kfake handles it
	})
	cfg := testConfig(t, c.ListenAddrs(), 1)
	cfg.PollBatch = 2
	publishN(t, openSink(t, cfg), 2, func(int) string { return "k" })
	src := openShare(t, cfg)
	if src.Capabilities().ExtendLease {
		t.Error("Capabilities().ExtendLease on a Kafka 4.1 broker")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	buf := make([]*ackwise.Message, 1) // the poll's other record stays in the source
	if n, err := src.Receive(ctx, buf); n != 1 || err != nil {
		t.Fatalf("Receive = %d, %v", n, err)
	}
	if err := src.ExtendLease(ctx, buf[0], time.Second); err == nil {
		t.Error("ExtendLease on a Kafka 4.1 broker succeeded")
	}
	if err := src.Ack(ctx, buf[0]); err != nil {
		t.Fatal(err)
	}
	// The source's renewal rounds for the record it holds back come every
	// sixth of the lock: half the lock holds a few (no signal to await).
	time.Sleep(500 * time.Millisecond)
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if slices.Contains(types, int8(kgo.AckRenew)) {
		t.Fatalf("statuses sent %v: a renewal went to a broker that cannot renew", types)
	}
	if !slices.Contains(types, int8(kgo.AckAccept)) {
		t.Fatalf("statuses sent %v: no accept", types)
	}
}
