package sqs

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// Pollers of a Source.
const (
	// DefaultPollers is how many ReceiveMessage calls a source keeps under
	// way at once, room allowing.
	DefaultPollers = 2
	// MaxPollers bounds Config.Pollers.
	MaxPollers = 64
	// releaseTimeout bounds the calls that hand back messages received but
	// never handed over.
	releaseTimeout = 10 * time.Second
)

// pollers runs a source's ReceiveMessage calls: up to n at once, each
// asking for no more messages than the engine's window has room for.
//
// The room is what the latest Receive asked for (the engine asks for no
// more than its free in-flight places) less what was handed over since: it
// shrinks as messages are handed over and is set again by each Receive.
// Messages received and not handed over (ready) and those polls under way
// may bring (reserved) count against it, so that the engine's messages in
// flight plus the source's never exceed the engine's window. Polls go on
// between two Receive calls with the room left. When the context of the
// latest Receive ends (the engine stopped) no more start, and the messages
// ready and those the polls under way bring are handed back (visibility 0)
// rather than left to burn their visibility timeout; the polls under way
// run to their end (Close cancels them).
//
// On a FIFO queue two polls never hold messages of one group: SQS hands
// out no message of a group while an earlier one is in flight, so the
// order in which polls return keeps each group's order.
type pollers struct {
	s *Source
	n int

	mu       sync.Mutex
	room     int                // see above
	reserved int                // messages the polls under way asked for
	running  int                // polls under way
	ready    []*ackwise.Message // received, not handed over, oldest first
	err      error              // a poll's error, for the next Receive
	active   bool               // the latest Receive's context has not ended
	watch    uint64             // the latest Receive's, whose context ends active
	unwatch  func() bool        // stops watching the latest Receive's context
	notify   chan struct{}      // capacity 1: ready or err changed
	wg       sync.WaitGroup     // polls and releases under way
	in       sqs.ReceiveMessageInput
}

func newPollers(s *Source, n int) *pollers {
	return &pollers{
		s:      s,
		n:      n,
		notify: make(chan struct{}, 1),
		in: sqs.ReceiveMessageInput{
			QueueUrl:          aws.String(s.queueURL),
			WaitTimeSeconds:   s.wait,
			VisibilityTimeout: int32(s.lease / time.Second),
			// local-aws-sqs returns ApproximateReceiveCount only when
			// AttributeNames asks for it (MessageSystemAttributeNames
			// alone gave an empty map); AWS documents both. Ask with both.
			AttributeNames:              []types.QueueAttributeName{types.QueueAttributeNameAll},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
			MessageAttributeNames:       []string{"All"},
		},
	}
}

// receive is Source.Receive.
func (p *pollers) receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	s := p.s
	p.mu.Lock()
	if s.closed.Load() {
		p.mu.Unlock()
		return 0, adapters.ErrClosed
	}
	p.room = len(buf)
	// The latest Receive's context ends the polling: the one of an
	// earlier Receive, ending later (a Receive with a context of its own
	// per call), does not.
	if p.unwatch != nil {
		p.unwatch()
	}
	p.watch++
	watch := p.watch
	p.unwatch = context.AfterFunc(ctx, func() { p.halt(watch) })
	p.active = ctx.Err() == nil
	for {
		if n := copy(buf, p.ready); n > 0 {
			clear(p.ready[:n])
			p.ready = p.ready[n:]
			if len(p.ready) == 0 {
				p.ready = p.ready[:0:0] // let go of the array
			}
			p.room = max(p.room-n, 0)
			p.startLocked()
			p.mu.Unlock()
			return n, nil
		}
		if err := p.err; err != nil {
			p.err = nil
			p.mu.Unlock()
			return 0, err
		}
		p.startLocked()
		p.mu.Unlock()
		select {
		case <-p.notify:
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-s.stop.Done():
			return 0, adapters.ErrClosed
		}
		p.mu.Lock()
		if s.closed.Load() {
			p.mu.Unlock()
			return 0, adapters.ErrClosed
		}
	}
}

// startLocked starts polls while fewer than n are under way and the room
// is not taken: by messages ready, or asked for by the polls under way.
// Not after an error that the next Receive has yet to return: the engine
// backs off between the two. Called with p.mu held.
func (p *pollers) startLocked() {
	if !p.active || p.err != nil || p.s.closed.Load() {
		return
	}
	for p.running < p.n {
		ask := min(p.room-p.reserved-len(p.ready), maxBatch)
		if ask <= 0 {
			return
		}
		p.running++
		p.reserved += ask
		p.wg.Add(1)
		go p.poll(ask)
	}
}

// poll makes one ReceiveMessage call of up to ask messages. Only Close
// cancels it: cancelled during its long poll, it may leave messages SQS had
// already handed out invisible until their visibility timeout ends, so a
// Receive's context ending lets it run to its end instead.
func (p *pollers) poll(ask int) {
	defer p.wg.Done()
	s := p.s
	ctx := s.stop
	in := p.in // a copy: each poll asks for its own count
	in.MaxNumberOfMessages = int32(ask)
	out, err := s.client.ReceiveMessage(ctx, &in)
	arrived := s.now()
	var got []types.Message
	if err == nil {
		got = out.Messages
	}
	if len(got) > ask {
		// More than asked for would break SQS's contract: hand those back.
		s.log.Warn("sqs: a receive returned more messages than asked for; the rest are handed back", slog.String(ackwise.LogKeySource, s.name), slog.Int("asked", ask), slog.Int("got", len(got)))
		p.release(handles(got[ask:]))
		got = got[:ask]
	}
	if err == nil && len(got) == 0 && s.wait == 0 {
		// Short polling: SQS answered at once with nothing; pause before
		// the next poll, holding this one's place.
		select {
		case <-ctx.Done():
		case <-time.After(shortPollPause):
		}
	}
	p.mu.Lock()
	p.running--
	p.reserved -= ask
	if !p.active || s.closed.Load() {
		// The Receive's context ended (or the source closed) while this
		// poll was under way: nobody takes these now.
		p.mu.Unlock()
		p.release(handles(got))
		return
	}
	switch {
	case err != nil:
		p.err = fmt.Errorf("sqs: receive from %s: %w", s.name, err)
	default:
		for _, m := range got {
			p.ready = append(p.ready, s.message(m, arrived))
		}
	}
	if err != nil || len(got) > 0 {
		select {
		case p.notify <- struct{}{}:
		default:
		}
	}
	p.startLocked()
	p.mu.Unlock()
}

// halt stops the polling if watch is still the latest Receive's: that
// Receive's context ended, or the source closes. No poll starts until the
// next Receive; the messages ready go back to the queue (visibility 0), and
// so do those the polls under way bring.
func (p *pollers) halt(watch uint64) {
	p.mu.Lock()
	if !p.active || watch != p.watch {
		p.mu.Unlock()
		return
	}
	p.active = false
	p.room = 0
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	hs := make([]string, 0, len(ready))
	for _, m := range ready {
		if r, ok := m.Handle.(*receipt); ok && r.state.CompareAndSwap(open, settled) {
			hs = append(hs, r.handle)
		}
	}
	p.release(hs)
}

// close halts the polls and waits for them (Close cancelled them) and the
// releases they make.
func (p *pollers) close() {
	p.mu.Lock()
	watch := p.watch
	p.mu.Unlock()
	p.halt(watch)
	p.mu.Lock()
	if p.unwatch != nil {
		p.unwatch()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// handles returns the receipt handles of ms.
func handles(ms []types.Message) []string {
	hs := make([]string, len(ms))
	for i, m := range ms {
		hs[i] = aws.ToString(m.ReceiptHandle)
	}
	return hs
}

// release hands back the messages of receipt handles hs, received and never
// handed over, with ChangeMessageVisibilityBatch calls setting their
// visibility to 0, so that they come back at once rather than after their
// visibility timeout. It is best effort: a message it fails to hand back
// comes back after its visibility timeout, and it is logged.
func (p *pollers) release(hs []string) {
	if len(hs) == 0 {
		return
	}
	s := p.s
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	for len(hs) > 0 {
		k := min(len(hs), maxBatch)
		entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, k)
		for i, h := range hs[:k] {
			entries[i] = types.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(h), VisibilityTimeout: 0}
		}
		out, err := s.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(s.queueURL), Entries: entries})
		failed := len(entries)
		if err == nil {
			failed = len(out.Failed)
		}
		if failed > 0 {
			s.log.Warn("sqs: messages received but not handed over could not be handed back; they come back after their visibility timeout", slog.String(ackwise.LogKeySource, s.name), slog.Int("count", failed), slog.Any(ackwise.LogKeyError, err))
		}
		hs = hs[k:]
	}
}
