package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

// A batch handler writing a batch of readings in one go: each message gets
// its own outcome, so the one reading that does not decode is
// dead-lettered alone and the others are stored and acked.
func ExampleNewBatch() {
	ctx := context.Background()
	b, _ := memory.New(memory.Config{})
	for i, v := range []string{`{"c": 21.5}`, `{"c": 19}`, `{"c": "warm"}`, `{"c": 23}`} {
		_ = b.Publish(ctx, "readings", &ackwise.Message{ID: fmt.Sprintf("r%d", i+1), Key: fmt.Sprintf("sensor-%d", i), Payload: []byte(v)})
	}

	var mu sync.Mutex
	var stored []string // stands for a table written with one multi-row INSERT
	handler := ackwise.BatchHandlerFunc(func(ctx context.Context, msgs []*ackwise.Message) error {
		outcome := ackwise.NewBatchError(len(msgs))
		var rows []string
		for i, m := range msgs {
			var r struct{ C float64 }
			if err := json.Unmarshal(m.Payload, &r); err != nil {
				outcome.Set(i, ackwise.Permanent(fmt.Errorf("decode reading: %w", err)))
				continue
			}
			rows = append(rows, fmt.Sprintf("%s=%.1f", m.ID, r.C))
		}
		mu.Lock()
		stored = append(stored, rows...) // one statement for the whole batch
		mu.Unlock()
		return outcome.Err() // nil when every message succeeded
	})

	src, _ := b.QueueSource("readings")
	defer src.Close()
	c, err := consumer.NewBatch(src, handler, consumer.Config{
		Name:  "thermo",
		Batch: consumer.BatchConfig{Size: 100},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	_ = b.WaitHistory(ctx, "readings", func(events []memory.Event) bool {
		settled := 0
		for _, e := range events {
			if e.Kind == memory.EventAcked || e.Kind == memory.EventDeadLettered {
				settled++
			}
		}
		return settled == 4
	})
	stop()
	<-done

	st := c.Stats()
	sort.Strings(stored)
	fmt.Printf("acked=%d dead_lettered=%d stored=%s\n", st.Acked, st.DeadLettered, strings.Join(stored, ","))
	dead, _ := b.Messages("readings.dlq")
	env, _ := dlq.Decode(dead[0].Headers)
	fmt.Println(dead[0].ID, env.Reason)
	// Output:
	// acked=3 dead_lettered=1 stored=r1=21.5,r2=19.0,r4=23.0
	// r3 permanent
}
