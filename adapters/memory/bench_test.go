package memory_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
)

// benchMsgs returns n messages with IDs, keys and a 64-byte payload, built
// before the timer starts (a producer owns its messages).
func benchMsgs(n int) []*ackwise.Message {
	payload := make([]byte, 64)
	msgs := make([]*ackwise.Message, n)
	for i := range msgs {
		msgs[i] = &ackwise.Message{ID: "evt-" + strconv.Itoa(i), Key: "key-" + strconv.Itoa(i%64), Payload: payload}
	}
	return msgs
}

func benchBroker(b *testing.B) *memory.Broker {
	br, err := memory.New(memory.Config{DisableHistory: true, Topic: memory.TopicConfig{Retention: 1 << 16}})
	if err != nil {
		b.Fatal(err)
	}
	return br
}

// openBench opens a sink and a source on a queue or a 4-partition topic.
func openBench(b *testing.B, br *memory.Broker, mode string) (adapters.Sink, adapters.Source) {
	var src adapters.Source
	var err error
	switch mode {
	case "queue":
		src, err = br.QueueSource("q")
	case "fifo":
		if err = br.CreateQueue("q", memory.QueueConfig{FIFO: true}); err == nil {
			src, err = br.QueueSource("q")
		}
	case "log":
		if err = br.CreateTopic("q", memory.TopicConfig{Partitions: 4, Retention: 1 << 16}); err == nil || errors.Is(err, memory.ErrConflict) {
			src, err = br.JoinGroup("q", "g")
		}
	}
	if err != nil {
		b.Fatal(err)
	}
	sink, err := br.Sink("q")
	if err != nil {
		b.Fatal(err)
	}
	return sink, src
}

// BenchmarkPublishReceiveAck measures one message's full path through the
// adapter — publish (confirmed), receive, ack — in batches of 64 on one
// goroutine: the adapter's own cost per message.
func BenchmarkPublishReceiveAck(b *testing.B) {
	for _, mode := range []string{"queue", "fifo", "log"} {
		b.Run(mode, func(b *testing.B) {
			br := benchBroker(b)
			sink, src := openBench(b, br, mode)
			ctx := context.Background()
			const batch = 64
			msgs := benchMsgs(batch)
			buf := make([]*ackwise.Message, batch)
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				k := min(batch, b.N-done)
				if err := sink.Publish(ctx, msgs[:k]...); err != nil {
					b.Fatal(err)
				}
				for got := 0; got < k; {
					n, err := src.Receive(ctx, buf)
					if err != nil {
						b.Fatal(err)
					}
					for _, m := range buf[:n] {
						if err := src.Ack(ctx, m); err != nil {
							b.Fatal(err)
						}
					}
					got += n
				}
				done += k
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

// BenchmarkConcurrent runs a publisher, a receiver and 4 ack workers on
// their own goroutines, as the engine does (Valid checked before each ack).
func BenchmarkConcurrent(b *testing.B) {
	for _, mode := range []string{"queue", "log"} {
		b.Run(mode, func(b *testing.B) {
			br := benchBroker(b)
			sink, src := openBench(b, br, mode)
			ctx := context.Background()
			const batch = 64
			msgs := benchMsgs(batch)
			work := make(chan *ackwise.Message, 256)
			// The publisher stays at most 64 batches ahead, as a producer
			// feeding a consumer at its pace would (and a topic's retention
			// would otherwise drop what the consumer has not read).
			credits := make(chan struct{}, 64)
			var wg sync.WaitGroup
			b.ReportAllocs()
			b.ResetTimer()
			wg.Add(1)
			go func() {
				defer wg.Done()
				for done := 0; done < b.N; {
					k := min(batch, b.N-done)
					credits <- struct{}{}
					if err := sink.Publish(ctx, msgs[:k]...); err != nil {
						b.Error(err)
						return
					}
					done += k
				}
			}()
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for m := range work {
						if !src.Valid(m) {
							b.Error("invalid delivery")
						}
						if err := src.Ack(ctx, m); err != nil {
							b.Error(err)
						}
					}
				}()
			}
			buf := make([]*ackwise.Message, batch)
			for got, credited := 0, 0; got < b.N; {
				n, err := src.Receive(ctx, buf)
				if err != nil {
					b.Fatal(err)
				}
				for _, m := range buf[:n] {
					work <- m
				}
				got += n
				for ; credited+batch <= got; credited += batch {
					<-credits
				}
			}
			close(work)
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

// BenchmarkReceiveAck measures the consuming side alone, as the engine sees
// it: b.N messages are published before the timer starts, then received in
// batches of 64, checked with Valid and acked.
func BenchmarkReceiveAck(b *testing.B) {
	for _, mode := range []string{"queue", "log"} {
		b.Run(mode, func(b *testing.B) {
			br := benchBroker(b)
			if mode == "log" {
				// Keep everything: the backlog is published up front.
				if err := br.CreateTopic("q", memory.TopicConfig{Partitions: 4}); err != nil {
					b.Fatal(err)
				}
			}
			sink, src := openBench(b, br, mode)
			ctx := context.Background()
			const batch = 64
			msgs := benchMsgs(b.N)
			for i := 0; i < b.N; i += 1024 {
				if err := sink.Publish(ctx, msgs[i:min(i+1024, b.N)]...); err != nil {
					b.Fatal(err)
				}
			}
			buf := make([]*ackwise.Message, batch)
			b.ReportAllocs()
			b.ResetTimer()
			for got := 0; got < b.N; {
				n, err := src.Receive(ctx, buf)
				if err != nil {
					b.Fatal(err)
				}
				for _, m := range buf[:n] {
					if !src.Valid(m) {
						b.Fatal("invalid")
					}
					if err := src.Ack(ctx, m); err != nil {
						b.Fatal(err)
					}
				}
				got += n
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
