package rabbitmq

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
)

// TestSinkRandomRefusals checks the sink's per-message report against what
// the queue holds, on the real broker: a classic queue that refuses
// (basic.nack) a message that would take it over randomLimit bytes, and
// per seed a few batches of concurrent Publish calls on one sink, of random
// sizes, with random payload sizes (some over the limit) and some messages
// no queue is bound for (basic.return). The queue is drained after each
// batch. A message the sink reports confirmed is in the queue exactly once;
// one listed with ErrNacked or ErrUnroutable is not; nothing else is.
// Replay one seed with -run 'TestSinkRandomRefusals/seed=N$'.
func TestSinkRandomRefusals(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			sinkRandomRefusals(t, seed)
		})
	}
}

const randomLimit = 16 << 10

// sent is one message a random batch published, and what became of it.
type sent struct {
	msg        *ackwise.Message
	unroutable bool  // its routing key has no queue bound
	err        error // the sink's report: nil when not listed
}

func sinkRandomRefusals(t *testing.T, seed uint64) {
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	good, nowhere := cfg.Queue, cfg.Queue+"-nowhere"
	if err := withChannel(c, func(ch *amqp.Channel) error {
		return ch.QueueBind(cfg.Queue, good, "amq.direct", false, nil)
	}); err != nil {
		t.Fatal(err)
	}
	rejectOver(t, c, cfg.Queue, randomLimit)
	// No routing key of its own: each message goes with its Key.
	sink := newSink(t, SinkConfig{URL: cfg.URL, Exchange: "amq.direct", ConnectionName: cfg.ConnectionName})

	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	var confirmed, nacked, unroutable int
	for b := range 4 {
		calls := make([][]*sent, 2+rng.IntN(4))
		for ci := range calls {
			calls[ci] = make([]*sent, 1+rng.IntN(24))
			for i := range calls[ci] {
				var size int
				switch r := rng.IntN(100); {
				case r < 10: // over the limit on its own: always refused
					size = randomLimit + 1 + rng.IntN(randomLimit)
				case r < 15:
					size = 0
				default:
					size = 1 + rng.IntN(2<<10)
				}
				id := fmt.Sprintf("s%d-b%d-c%d-m%d", seed, b, ci, i)
				payload := make([]byte, size)
				for k := range payload {
					payload[k] = id[k%len(id)]
				}
				s := &sent{msg: &ackwise.Message{ID: id, Key: good, Payload: payload}}
				if rng.IntN(100) < 10 {
					s.unroutable, s.msg.Key = true, nowhere
				}
				calls[ci][i] = s
			}
		}
		var wg sync.WaitGroup
		for _, call := range calls {
			wg.Go(func() {
				msgs := make([]*ackwise.Message, len(call))
				for i, s := range call {
					msgs[i] = s.msg
				}
				err := sink.Publish(ctxT(t), msgs...)
				if err == nil {
					return
				}
				pe, ok := errors.AsType[*adapters.PublishError](err)
				if !ok {
					t.Errorf("batch %d: Publish = %v, want nil or an adapters.PublishError", b, err)
					return
				}
				for _, f := range pe.Failed {
					call[f.Index].err = f.Err
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}

		want := map[string]*sent{}
		stored := 0
		for _, call := range calls {
			for _, s := range call {
				id := s.msg.ID
				switch {
				case s.err == nil:
					if s.unroutable {
						t.Errorf("%s: no queue is bound for its key, yet reported confirmed", id)
					}
					if len(s.msg.Payload) > randomLimit {
						t.Errorf("%s: %d bytes, over the queue's limit, yet reported confirmed", id, len(s.msg.Payload))
					}
					want[id] = s
					stored += len(s.msg.Payload)
					confirmed++
				case errors.Is(s.err, ErrUnroutable):
					if !s.unroutable {
						t.Errorf("%s: reported unroutable, but its key is bound: %v", id, s.err)
					}
					unroutable++
				case errors.Is(s.err, ErrNacked):
					if s.unroutable {
						t.Errorf("%s: no queue is bound for its key, yet reported nacked, not unroutable: %v", id, s.err)
					}
					nacked++
				default:
					t.Errorf("%s: listed with %v, want ErrNacked or ErrUnroutable", id, s.err)
				}
			}
		}
		if stored > randomLimit {
			t.Errorf("batch %d: %d bytes reported confirmed, more than the queue takes (%d)", b, stored, randomLimit)
		}
		seen := map[string]int{}
		for _, d := range getAll(t, c, cfg.Queue) {
			id, _ := d.Headers[ackwise.HeaderEventID].(string)
			seen[id]++
			s, ok := want[id]
			switch {
			case !ok:
				t.Errorf("batch %d: queue holds %q (message-id %q, %d bytes), which the sink did not report confirmed", b, id, d.MessageId, len(d.Body))
			case d.MessageId != id || !bytes.Equal(d.Body, s.msg.Payload):
				t.Errorf("batch %d: %s stored with message-id %q and a %d-byte body, want its own and %d bytes", b, id, d.MessageId, len(d.Body), len(s.msg.Payload))
			case seen[id] == 2:
				t.Errorf("batch %d: %s stored more than once", b, id)
			}
		}
		for id := range want {
			if seen[id] == 0 {
				t.Errorf("batch %d: %s reported confirmed but not in the queue", b, id)
			}
		}
		if t.Failed() {
			return
		}
	}
	if nacked == 0 {
		t.Errorf("no message nacked: the seed exercised no refusal")
	}
	t.Logf("seed %d: %d confirmed, %d nacked, %d unroutable", seed, confirmed, nacked, unroutable)
}

// TestDeadLetterRefusedWaitsInPlace: the dead-letter queue is full (it
// refuses with basic.nack a message that would take it over its
// max-length-bytes, overflow reject-publish) when a message fails
// permanently. The refused dead letter must not ack its original: the
// engine tries the move again in place, the message valid and not
// requeued, its handler run once; once the dead-letter queue has room the
// dead letter is written once and the original acked.
func TestDeadLetterRefusedWaitsInPlace(t *testing.T) {
	t.Parallel()
	c, cfg, v, src, log := moveOutage(t)
	const limit = 1 << 10
	rejectOver(t, c, v.DeadLetterQueue, limit)
	rawPublish(t, c, v.DeadLetterQueue, amqp.Publishing{MessageId: "filler", Body: make([]byte, limit)})
	var runs atomic.Int32
	stop := runEngine(t, src, failPermanently(&runs), consumer.Config{Observer: log})

	awaitFailedTriesWith(t, log, src.errs, 3, ErrNacked)
	if n := queueDepth(t, c, cfg.Queue); n != 0 || runs.Load() != 1 {
		t.Fatalf("while the dead letter is refused: %d ready in the work queue, %d handler runs; want 0 (held, not requeued) and 1", n, runs.Load())
	}
	// Make room. The dead letter cannot be stored beside the filler, so
	// the purge takes the filler alone.
	var purged int
	if err := withChannel(c, func(ch *amqp.Channel) (err error) {
		purged, err = ch.QueuePurge(v.DeadLetterQueue, false)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if purged != 1 {
		t.Fatalf("full dead-letter queue held %d messages, want the filler alone: a refused dead letter was stored", purged)
	}
	requireDeadLetteredOnce(t, c, cfg, v, src, log, stop, &runs)
}
