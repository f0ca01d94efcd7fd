package kafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// TestSinkRandomSizes checks the sink's per-record report against what the
// topic holds: per seed a topic of a few partitions with a small
// max.message.bytes (randomMaxBytes) and a few rounds of concurrent Publish
// calls on one sink, with random keys (some none) and random payload sizes:
// some over the limit, some just under it (alone in a batch they fit;
// batched with others they may not), some empty, most small. Kafka refuses
// a partition's batch as a whole, and franz-go then fails what it buffered
// on that partition, so records of other calls may fail beside a large one.
// The limit is set before NewSink (the sink reads it and batches under it)
// (odd seeds) or after (the broker refuses whole batches). Read back
// (read_committed):
//   - a record not listed in its call's PublishError is in the topic exactly
//     once, with its payload;
//   - a record listed with a permanent MESSAGE_TOO_LARGE is not, and, the
//     limit known to the sink, is over it;
//   - a record over the limit is always listed;
//   - the topic holds nothing else;
//   - a key is on one partition, and a call's confirmed records of one key
//     are at ascending offsets in call order.
//
// On every fourth seed the sink is closed (flush cut short) while the first
// round publishes: then a record may also be listed with adapters.ErrClosed
// (it may or may not be stored, once at most), or the whole call returns
// adapters.ErrClosed when it came after Close; the unlisted are stored.
// Replay one seed with -run 'TestSinkRandomSizes/seed=N$'.
func TestSinkRandomSizes(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			sinkRandomSizes(t, seed, seed%4 == 0)
		})
	}
}

const randomMaxBytes = 2048

// published is one record a random call published, and what became of it.
type published struct {
	msg    *ackwise.Message
	listed bool
	err    error // the sink's report when listed
}

func sinkRandomSizes(t *testing.T, seed uint64, closeMidway bool) {
	rng := rand.New(rand.NewPCG(seed, 0x51be))
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, int32(2+rng.IntN(4)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Set before NewSink, the sink batches under the limit: the records
	// that fit alone are all confirmed. Set after, the broker refuses
	// whole batches.
	limitKnown := seed%2 == 1
	if limitKnown {
		setMaxMessageBytes(ctx, t, brokers, cfg.Topic, randomMaxBytes)
	}
	sink := openSink(t, cfg)
	if !limitKnown {
		setMaxMessageBytes(ctx, t, brokers, cfg.Topic, randomMaxBytes)
	}
	rounds := 3
	if closeMidway {
		rounds = 1
		sink.closeFlushTimeout = 0 // Close fails what is unconfirmed at once
	}
	// A first record, alone, so that the producer ID and the metadata
	// are loaded before the rounds (a Close midway then finds records
	// confirmed, in flight and not yet published).
	warm := []*published{{msg: &ackwise.Message{ID: fmt.Sprintf("s%d-warm", seed), Key: "k1", Payload: []byte("warm")}}}
	if publishRandom(ctx, t, sink, warm, false); warm[0].listed {
		t.Fatalf("a first small record failed: %v", warm[0].err)
	}
	calls := [][]*published{warm}
	for r := range rounds {
		round := make([][]*published, 2+rng.IntN(4))
		for ci := range round {
			round[ci] = make([]*published, 1+rng.IntN(16))
			for i := range round[ci] {
				id := fmt.Sprintf("s%d-r%d-c%d-m%d", seed, r, ci, i)
				m := &ackwise.Message{ID: id, Payload: randomPayload(rng)}
				if k := rng.IntN(8); k > 0 {
					m.Key = "k" + strconv.Itoa(k)
				}
				round[ci][i] = &published{msg: m}
			}
		}
		// The calls start at random moments over 10ms, and so does
		// Close: some calls are confirmed before it, some are in
		// flight, some come after it.
		var wg sync.WaitGroup
		for _, call := range round {
			wait := time.Duration(rng.IntN(10_000)) * time.Microsecond
			wg.Go(func() {
				time.Sleep(wait)
				publishRandom(ctx, t, sink, call, closeMidway)
			})
		}
		if closeMidway {
			time.Sleep(time.Duration(rng.IntN(10_000)) * time.Microsecond)
			_ = sink.Close() // the flush cut short: an error when any was unconfirmed
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		calls = append(calls, round...)
	}

	recs := readAll(ctx, t, brokers, cfg.Topic, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	byID := map[string][]*kgo.Record{}
	for _, r := range recs {
		id := recordMessage(r).ID
		byID[id] = append(byID[id], r)
	}
	var confirmed, tooLarge, closed, closedStored, nearConfirmed int
	keyPartition := map[string]int32{}
	for _, call := range calls {
		lastOffset := map[string]int64{} // key -> offset of the call's last confirmed record of it
		for _, p := range call {
			id, stored := p.msg.ID, byID[p.msg.ID]
			delete(byID, id)
			over := len(p.msg.Payload) > randomMaxBytes
			switch {
			case !p.listed:
				confirmed++
				if len(p.msg.Payload) > randomMaxBytes-256 {
					nearConfirmed++
				}
				if over {
					t.Errorf("%s: %d bytes, over max.message.bytes %d, yet reported confirmed", id, len(p.msg.Payload), randomMaxBytes)
				}
				if len(stored) != 1 {
					t.Errorf("%s: reported confirmed, stored %d times", id, len(stored))
					continue
				}
				r := stored[0]
				if !bytes.Equal(r.Value, p.msg.Payload) || string(r.Key) != p.msg.Key {
					t.Errorf("%s: stored with key %q and %d bytes, want key %q and %d bytes", id, r.Key, len(r.Value), p.msg.Key, len(p.msg.Payload))
				}
				if p.msg.Key == "" {
					continue
				}
				if part, ok := keyPartition[p.msg.Key]; ok && part != r.Partition {
					t.Errorf("%s: key %s on partitions %d and %d", id, p.msg.Key, part, r.Partition)
				}
				keyPartition[p.msg.Key] = r.Partition
				if last, ok := lastOffset[p.msg.Key]; ok && r.Offset <= last {
					t.Errorf("%s: key %s at offset %d, not after the call's previous record of the key (%d)", id, p.msg.Key, r.Offset, last)
				}
				lastOffset[p.msg.Key] = r.Offset
			case errors.Is(p.err, kerr.MessageTooLarge):
				tooLarge++
				if limitKnown && !over {
					t.Errorf("%s: %d bytes, fits under max.message.bytes %d the sink knew, yet refused: %v", id, len(p.msg.Payload), randomMaxBytes, p.err)
				}
				if ackwise.ClassOf(p.err) != ackwise.ClassPermanent {
					t.Errorf("%s: %v, class %v, want permanent", id, p.err, ackwise.ClassOf(p.err))
				}
				if len(stored) != 0 {
					t.Errorf("%s: refused (%v), yet stored %d times", id, p.err, len(stored))
				}
			case closeMidway && errors.Is(p.err, adapters.ErrClosed):
				closed++
				if len(stored) > 0 {
					closedStored++
				}
				if len(stored) > 1 {
					t.Errorf("%s: listed with %v, stored %d times", id, p.err, len(stored))
				}
			default:
				t.Errorf("%s (%d bytes): listed with %v, want a permanent MESSAGE_TOO_LARGE", id, len(p.msg.Payload), p.err)
			}
		}
	}
	for id, rs := range byID {
		t.Errorf("topic holds %d record(s) with event ID %q (partition %d, offset %d), which no call published", len(rs), id, rs[0].Partition, rs[0].Offset)
	}
	if !closeMidway && (tooLarge == 0 || confirmed == 0) {
		t.Errorf("%d confirmed, %d refused: the seed exercised no mix", confirmed, tooLarge)
	}
	t.Logf("seed %d (replay: -run 'TestSinkRandomSizes/seed=%d$'), limit known to the sink %t: %d confirmed (%d within 256 bytes of the limit), %d refused too large, %d failed by Close (%d of them stored)",
		seed, seed, limitKnown, confirmed, nearConfirmed, tooLarge, closed, closedStored)
}

// randomPayload returns a payload of random bytes (the producer compresses;
// random bytes do not shrink) of a random size: over randomMaxBytes, just
// under it (fitting in a batch of its own), empty or small.
func randomPayload(rng *rand.Rand) []byte {
	var n int
	switch r := rng.IntN(100); {
	case r < 6:
		n = randomMaxBytes + 1 + rng.IntN(randomMaxBytes)
	case r < 16:
		// Batch header (61 bytes), the record's framing, key and
		// event-ID header take less than 160 bytes.
		n = randomMaxBytes - 160 - rng.IntN(32)
	case r < 21:
		return nil
	case r < 26:
		return []byte{}
	default:
		n = 1 + rng.IntN(randomMaxBytes/8)
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// publishRandom publishes call's messages in one Publish and records which
// the returned error lists, and with what. After Close a call may be
// refused as a whole (adapters.ErrClosed, no PublishError).
func publishRandom(ctx context.Context, t *testing.T, sink *Sink, call []*published, closing bool) {
	msgs := make([]*ackwise.Message, len(call))
	for i, p := range call {
		msgs[i] = p.msg
	}
	err := sink.Publish(ctx, msgs...)
	if err == nil {
		return
	}
	pe, ok := errors.AsType[*adapters.PublishError](err)
	if !ok && !(closing && errors.Is(err, adapters.ErrClosed)) {
		t.Errorf("Publish = %v, want nil or an adapters.PublishError", err)
		return
	}
	failed := adapters.PublishFailures(err, len(msgs))
	if ok && (len(failed) != len(pe.Failed) || &failed[0] != &pe.Failed[0]) {
		t.Errorf("Publish = %v: a malformed PublishError (no failure, one without an error, or indexes not ascending below %d)", err, len(msgs))
		return
	}
	for _, f := range failed {
		call[f.Index].listed, call[f.Index].err = true, f.Err
	}
}
