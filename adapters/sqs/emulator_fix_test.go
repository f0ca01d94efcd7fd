package sqs

import (
	"context"
	"sync"
	"time"

	"github.com/ackwise/ackwise"
)

// emulatorFIFOPollers is the Pollers of the tests' sources on FIFO
// queues. local-aws-sqs 2.0.2 has no message group lock: its receive hands
// out any visible message of a group while another of the group is in
// flight, where AWS hands out none (the SQS Developer Guide, "FIFO queue
// delivery logic"). Two polls under way at once may then each get messages
// of one group, and their responses come back in either order; on AWS the
// second poll gets none of that group. One poll at a time keeps the
// emulator's hand-out order.
const emulatorFIFOPollers = 1

// countFix works around local-aws-sqs 2.0.2, whose ChangeMessageVisibility
// adds one to a message's ApproximateReceiveCount as a receive does (its
// changeVisibility goes through the receive path). AWS documents the count
// as the number of receives, and the adapter codes to that: every Nack,
// Release or lease extension would otherwise count as an attempt here. The
// tests' sources subtract, from each delivery's Attempt, the visibility
// changes the tests' sources made on that message before.
type countFix struct {
	mu sync.Mutex
	cv map[string]int // by SQS message ID
}

func newCountFix() *countFix { return &countFix{cv: map[string]int{}} }

func (f *countFix) changed(id string) {
	f.mu.Lock()
	f.cv[id]++
	f.mu.Unlock()
}

func (f *countFix) fixed(id string, attempt int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return max(attempt-f.cv[id], 1)
}

// fixedSource is a Source whose deliveries' Attempt countFix corrects. It
// changes Receive only (and counts the settles that change visibility), so
// it keeps the Source's Extensions.
type fixedSource struct {
	*Source
	fix *countFix
}

func (s fixedSource) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	n, err := s.Source.Receive(ctx, buf)
	for _, m := range buf[:n] {
		m.Attempt = s.fix.fixed(m.BrokerID, m.Attempt)
	}
	return n, err
}

func (s fixedSource) Nack(ctx context.Context, m *ackwise.Message, d time.Duration) error {
	return s.count(m, s.Source.Nack(ctx, m, d))
}

func (s fixedSource) Release(ctx context.Context, m *ackwise.Message) error {
	return s.count(m, s.Source.Release(ctx, m))
}

func (s fixedSource) ExtendLease(ctx context.Context, m *ackwise.Message, d time.Duration) error {
	return s.count(m, s.Source.ExtendLease(ctx, m, d))
}

func (s fixedSource) count(m *ackwise.Message, err error) error {
	if err == nil {
		s.fix.changed(m.BrokerID)
	}
	return err
}
