package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/retry"
)

// Engine describes the store [RunEngine] drives and the effect its handler
// applies.
type Engine struct {
	// Store is the inbox under test.
	Store middleware.InboxStore
	// Handled reports whether key has a committed inbox record.
	Handled func(ctx context.Context, key middleware.InboxKey) (bool, error)
	// Apply applies msg's effect. ctx is the context the inbox hands the
	// handler (carrying the claim's transaction, if the store has one); an
	// error is returned by the handler. Nil (with Effects nil) means an
	// effect in another system the store cannot roll back: a count in
	// memory.
	Apply func(ctx context.Context, msg *ackwise.Message) error
	// Effects returns how many effects of eventID have been applied.
	Effects func(t testing.TB, eventID string) int
	// Transactional means the effect commits or rolls back with the inbox
	// record (pginbox, sqliteinbox): the handler then applies it before it
	// fails, and a failed attempt must leave none. Otherwise the store only
	// marks success (redisinbox, meminbox), and the handler fails before it
	// applies the effect.
	Transactional bool
}

// RunEngine drives e.Store under the consumer engine on the memory broker
// with every settle and dead-letter fault at once (duplicates, failed and
// lost acks, crashes before the ack, failed dead-letter publishes), two
// consumers on one queue, and a handler that fails transiently, panics or
// fails permanently on some events. Every event that succeeds must end with
// exactly one effect and one inbox record; every event that fails
// permanently with none, and a dead letter.
//
// It creates the records of consumer "billing" and events "ev-000" to
// "ev-119": give it a store (or a table, or a key prefix) of its own.
func RunEngine(t *testing.T, e Engine) {
	t.Helper()
	runEngine(t, e, false)
}

// RunEngineBatch is [RunEngine] with a batch handler: consumer.NewBatch
// (batches of up to 16) under [middleware.BatchInbox] on e.Store, which
// must implement [middleware.BatchInboxStore]. The handler applies each
// message's effect through the claim's transaction and gives it its own
// outcome in a *ackwise.BatchError, except that a batch holding a poison
// event fails as a whole, with one error, and the panic fails its whole
// batch too: the engine then runs each message again alone. The same promises hold:
// every event that succeeds ends with exactly one effect and one record,
// every poison event with none and a dead letter. e.Transactional must be
// set.
func RunEngineBatch(t *testing.T, e Engine) {
	t.Helper()
	if _, ok := e.Store.(middleware.BatchInboxStore); !ok {
		t.Fatalf("inboxtest: RunEngineBatch: store %T does not implement middleware.BatchInboxStore", e.Store)
	}
	if !e.Transactional {
		// A failed message makes BatchInbox run its batch-mates again:
		// only effects that roll back with the claim stay single.
		t.Fatal("inboxtest: RunEngineBatch needs Engine.Transactional: effects written through the claim's transaction")
	}
	runEngine(t, e, true)
}

func runEngine(t *testing.T, e Engine, batch bool) {
	t.Helper()
	const n = 120
	if e.Apply == nil && e.Effects == nil {
		var mu sync.Mutex
		effects := map[string]int{}
		e.Apply = func(_ context.Context, msg *ackwise.Message) error {
			mu.Lock()
			defer mu.Unlock()
			effects[msg.ID]++
			return nil
		}
		e.Effects = func(_ testing.TB, id string) int {
			mu.Lock()
			defer mu.Unlock()
			return effects[id]
		}
	}
	broker, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := broker.CreateQueue("orders", memory.QueueConfig{Lease: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := broker.CreateQueue("orders.dlq", memory.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	sink, err := broker.Sink("orders")
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		msg := &ackwise.Message{ID: fmt.Sprintf("ev-%03d", i), Key: fmt.Sprintf("k%d", i%7), Payload: []byte("x")}
		if err := sink.Publish(t.Context(), msg); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []memory.Fault{
		{Kind: memory.FaultDuplicate, Every: 4},
		{Kind: memory.FaultFailAck, Every: 6},
		{Kind: memory.FaultLoseAck, Every: 9},
		{Kind: memory.FaultCrashBeforeAck, Every: 17, Count: 4},
	} {
		if _, err := broker.InjectFault("orders", f); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := broker.InjectFault("orders.dlq", memory.Fault{Kind: memory.FaultFailPublish, Count: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := broker.InjectFault("orders.dlq", memory.Fault{Kind: memory.FaultFailPublish, AfterStore: true, Count: 1}); err != nil {
		t.Fatal(err)
	}

	poison := func(id string) bool { return id[len(id)-1] == '3' }
	var mu sync.Mutex
	runs := map[string]int{}
	handle := func(ctx context.Context, msg *ackwise.Message) error {
		mu.Lock()
		runs[msg.ID]++
		run := runs[msg.ID]
		mu.Unlock()
		if e.Transactional {
			if err := e.Apply(ctx, msg); err != nil {
				return err
			}
		}
		switch last := msg.ID[len(msg.ID)-1]; {
		case poison(msg.ID):
			return ackwise.Permanent(errors.New("poison"))
		case last == '5' && run == 1:
			return errors.New("transient")
		case last == '7' && run == 1:
			panic("handler bug")
		}
		if !e.Transactional {
			return e.Apply(ctx, msg)
		}
		return nil
	}
	newConsumer := func(src *memory.QueueSource, cfg consumer.Config) (*consumer.Consumer, error) {
		if !batch {
			inbox, err := middleware.Inbox(e.Store, middleware.InboxConfig{Consumer: "billing"})
			if err != nil {
				return nil, err
			}
			cfg.Inbox = inbox
			return consumer.New(src, ackwise.HandlerFunc(handle), cfg)
		}
		inbox, err := middleware.BatchInbox(e.Store.(middleware.BatchInboxStore), middleware.InboxConfig{Consumer: "billing"})
		if err != nil {
			return nil, err
		}
		cfg.Batch = consumer.BatchConfig{Size: 16, Linger: time.Millisecond, Inbox: inbox}
		return consumer.NewBatch(src, ackwise.BatchHandlerFunc(func(ctx context.Context, msgs []*ackwise.Message) error {
			out := ackwise.NewBatchError(len(msgs))
			poisoned := false
			for i, m := range msgs {
				out.Set(i, handle(ctx, m)) // a panic fails the whole batch
				poisoned = poisoned || (poison(m.ID) && len(msgs) > 1)
			}
			if poisoned {
				// One error for the whole batch, as a bulk statement
				// failing on one row gives: the inbox rolls every effect
				// back, and the engine runs each message alone.
				return ackwise.Permanent(errors.New("bulk write failed"))
			}
			return out.Err()
		}), cfg)
	}

	settled := func(events []memory.Event) map[string]bool {
		s := map[string]bool{}
		for _, e := range events {
			if e.Kind == memory.EventAcked || e.Kind == memory.EventDeadLettered {
				s[e.ID] = true
			}
		}
		return s
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Go(func() {
			for ctx.Err() == nil {
				src, err := broker.QueueSource("orders")
				if err != nil {
					errs <- err
					return
				}
				c, err := newConsumer(src, consumer.Config{
					Name: "billing", Concurrency: 4, RetryPanics: true,
					// Unlimited: the messages released unrun behind a
					// failed ack of their key spend deliveries too
					// (docs/ordering.md), and a limit would dead-letter
					// some after one failure of their own.
					Retry: retry.Policy{MaxAttempts: retry.Unlimited, InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond},
				})
				if err != nil {
					errs <- err
					return
				}
				runCtx, stop := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- c.Run(runCtx) }()
				id := src.ID()
				_ = broker.WaitHistory(ctx, "orders", func(events []memory.Event) bool {
					for _, e := range events {
						if e.Kind == memory.EventCrashed && e.Consumer == id {
							return true
						}
					}
					return false
				})
				stop()
				if err := <-done; err != nil && !errors.Is(err, memory.ErrCrashed) && !errors.Is(err, context.Canceled) {
					errs <- fmt.Errorf("run: %w", err)
				}
				_ = src.Close()
			}
		})
	}
	if err := broker.WaitHistory(ctx, "orders", func(events []memory.Event) bool { return len(settled(events)) == n }); err != nil {
		t.Errorf("waiting for every event to settle: %v", err)
	}
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	dead, err := broker.Messages("orders.dlq")
	if err != nil {
		t.Fatal(err)
	}
	deadIDs := map[string]int{}
	for _, m := range dead {
		deadIDs[m.ID]++
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		id := fmt.Sprintf("ev-%03d", i)
		handled, err := e.Handled(context.Background(), middleware.InboxKey{Consumer: "billing", EventID: id})
		if err != nil {
			t.Fatal(err)
		}
		eff := e.Effects(t, id)
		if poison(id) {
			if eff != 0 || handled || deadIDs[id] == 0 {
				t.Errorf("%s (poison): %d effects, record %v, %d dead letters; want 0, false, ≥1", id, eff, handled, deadIDs[id])
			}
			continue
		}
		if eff != 1 || !handled || deadIDs[id] != 0 {
			t.Errorf("%s: %d effects, record %v, %d dead letters (handler ran %d times); want 1, true, 0", id, eff, handled, deadIDs[id], runs[id])
		}
	}
}
