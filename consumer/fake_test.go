package consumer_test

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// fakeSource is a fake of the adapters.Source interface for unit tests of
// the engine's logic; adapters are proven by the conformance suite against
// real brokers.
type fakeSource struct {
	caps adapters.Capabilities

	mu          sync.Mutex
	cond        *sync.Cond
	queue       []*ackwise.Message
	closed      bool
	outstanding int // delivered, not settled
	maxOut      int // the most outstanding at once
	acked       []*ackwise.Message
	nacked      []nack
	dead        []deadLetter
	released    []*ackwise.Message
	lost        map[*ackwise.Message]bool // receipts lost with their connection (lose)
	changed     chan struct{}
}

type nack struct {
	msg   *ackwise.Message
	delay time.Duration
}

type deadLetter struct {
	msg *ackwise.Message
	env dlq.Envelope
}

func newFakeSource(caps adapters.Capabilities, msgs ...*ackwise.Message) *fakeSource {
	s := &fakeSource{caps: caps, changed: make(chan struct{}, 1)}
	s.cond = sync.NewCond(&s.mu)
	s.push(msgs...)
	return s
}

func (s *fakeSource) push(msgs ...*ackwise.Message) {
	s.mu.Lock()
	s.queue = append(s.queue, msgs...)
	s.mu.Unlock()
	s.cond.Broadcast()
}

func (s *fakeSource) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.queue) == 0 && !s.closed && ctx.Err() == nil {
		s.cond.Wait()
	}
	if s.closed {
		return 0, adapters.ErrClosed
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	n := copy(buf, s.queue)
	s.queue = s.queue[n:]
	s.outstanding += n
	s.maxOut = max(s.maxOut, s.outstanding)
	select { // for waitUntil on the queue
	case s.changed <- struct{}{}:
	default:
	}
	return n, nil
}

func (s *fakeSource) settled() {
	s.outstanding--
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func (s *fakeSource) Ack(_ context.Context, m *ackwise.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.acked = append(s.acked, m)
	s.settled()
	return nil
}

func (s *fakeSource) Nack(_ context.Context, m *ackwise.Message, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.caps.Delay {
		return errors.New("fake: no delay")
	}
	s.nacked = append(s.nacked, nack{m, d})
	s.settled()
	return nil
}

func (s *fakeSource) DeadLetter(_ context.Context, m *ackwise.Message, env dlq.Envelope) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dead = append(s.dead, deadLetter{m, env})
	s.settled()
	return nil
}

func (s *fakeSource) Release(_ context.Context, m *ackwise.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.released = append(s.released, m)
	s.settled()
	return nil
}

func (s *fakeSource) ExtendLease(context.Context, *ackwise.Message, time.Duration) error { return nil }

// Valid is false for a message whose receipt was lost (lose).
func (s *fakeSource) Valid(m *ackwise.Message) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.lost[m]
}

// lose makes m's receipt invalid, as a settle call failing because the
// connection dropped under it would: the broker redelivers m.
func (s *fakeSource) lose(m *ackwise.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost == nil {
		s.lost = make(map[*ackwise.Message]bool)
	}
	s.lost[m] = true
}

func (s *fakeSource) Capabilities() adapters.Capabilities { return s.caps }
func (s *fakeSource) Extensions() adapters.Extensions     { return adapters.Extensions{} }

func (s *fakeSource) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cond.Broadcast()
	return nil
}

// waitSettled blocks until n messages were settled in total or the timeout.
func (s *fakeSource) waitSettled(n int, timeout time.Duration) bool {
	return s.waitUntil(timeout, func() bool { return len(s.acked)+len(s.nacked)+len(s.dead) >= n })
}

// waitReleased blocks until n messages were released or the timeout.
func (s *fakeSource) waitReleased(n int, timeout time.Duration) bool {
	return s.waitUntil(timeout, func() bool { return len(s.released) >= n })
}

// waitUntil blocks until done, checked under s.mu after each settle, holds
// or the timeout.
func (s *fakeSource) waitUntil(timeout time.Duration, done func() bool) bool {
	deadline := time.After(timeout)
	for {
		s.mu.Lock()
		ok := done()
		s.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-s.changed:
		case <-deadline:
			return false
		}
	}
}

// nackedMsgs, deadMsgs and releasedMsgs copy what the source recorded, under
// its lock.
func (s *fakeSource) nackedMsgs() []*ackwise.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*ackwise.Message, len(s.nacked))
	for i, n := range s.nacked {
		out[i] = n.msg
	}
	return out
}

func (s *fakeSource) deadMsgs() []deadLetter {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]deadLetter(nil), s.dead...)
}

func (s *fakeSource) releasedMsgs() []*ackwise.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*ackwise.Message(nil), s.released...)
}
