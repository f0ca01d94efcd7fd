package sqs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// deleteTimeout bounds one DeleteMessageBatch call, which serves several
// callers and so cannot take one's ctx.
const deleteTimeout = 30 * time.Second

// deleter deletes messages in DeleteMessageBatch calls of up to 10, each
// sent once full or linger after its first entry.
type deleter struct {
	s      *Source
	linger time.Duration
	in     chan *delReq
	mu     sync.RWMutex // held to send on in; Lock to close it
	closed bool
	done   chan struct{} // closed when run returned
	calls  sync.WaitGroup
}

type delReq struct {
	msg *ackwise.Message
	r   *receipt
	err chan error // buffered: the result
}

func newDeleter(s *Source, linger time.Duration) *deleter {
	d := &deleter{s: s, linger: linger, in: make(chan *delReq, 4*maxBatch), done: make(chan struct{})}
	go d.run()
	return d
}

// delete deletes msg and waits for the result.
func (d *deleter) delete(ctx context.Context, msg *ackwise.Message, r *receipt) error {
	return d.wait(ctx, d.add(msg, r))
}

// add queues the delete of msg.
func (d *deleter) add(msg *ackwise.Message, r *receipt) *delReq {
	req := &delReq{msg: msg, r: r, err: make(chan error, 1)}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		req.err <- fmt.Errorf("sqs: ack message %s: %w; the queue redelivers it: %w", msg.BrokerID, adapters.ErrClosed, adapters.ErrReceiptInvalid)
		return req
	}
	d.in <- req
	return req
}

// wait returns the result of req, or ctx's error if ctx ends first (the
// delete may still happen).
func (d *deleter) wait(ctx context.Context, req *delReq) error {
	select {
	case err := <-req.err:
		return err
	case <-ctx.Done():
		return fmt.Errorf("sqs: ack message %s: not confirmed: %w", req.msg.BrokerID, ctx.Err())
	}
}

func (d *deleter) run() {
	defer close(d.done)
	for {
		req, ok := <-d.in
		if !ok {
			return
		}
		batch := []*delReq{req}
		var timeout <-chan time.Time
		var t *time.Timer
		if d.linger > 0 {
			t = time.NewTimer(d.linger)
			timeout = t.C
		}
	fill:
		for len(batch) < maxBatch {
			select {
			case req, ok := <-d.in:
				if !ok {
					break fill
				}
				batch = append(batch, req)
			default:
				if timeout == nil {
					break fill
				}
				select {
				case req, ok := <-d.in:
					if !ok {
						break fill
					}
					batch = append(batch, req)
				case <-timeout:
					break fill
				}
			}
		}
		if t != nil {
			t.Stop()
		}
		d.calls.Add(1)
		go d.flush(batch)
	}
}

// flush deletes batch with one call and hands each entry its result.
func (d *deleter) flush(batch []*delReq) {
	defer d.calls.Done()
	s := d.s
	entries := make([]types.DeleteMessageBatchRequestEntry, len(batch))
	for i, req := range batch {
		entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(req.r.handle)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
	defer cancel()
	out, err := s.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(s.queueURL), Entries: entries})
	if err != nil {
		for _, req := range batch {
			req.err <- s.settleErr("ack", req.msg, err)
		}
		return
	}
	results := make([]error, len(batch))
	answered := make([]bool, len(batch))
	for _, ok := range out.Successful {
		if i, err := strconv.Atoi(aws.ToString(ok.Id)); err == nil && i >= 0 && i < len(batch) {
			answered[i] = true
		}
	}
	for _, f := range out.Failed {
		i, err := strconv.Atoi(aws.ToString(f.Id))
		if err != nil || i < 0 || i >= len(batch) {
			continue
		}
		answered[i] = true
		code := aws.ToString(f.Code)
		if receiptGone(code) {
			results[i] = fmt.Errorf("sqs: ack message %s: %s, the queue redelivers it: %w", batch[i].msg.BrokerID, code, adapters.ErrReceiptInvalid)
		} else {
			results[i] = fmt.Errorf("sqs: ack message %s on %s: %s: %s", batch[i].msg.BrokerID, s.name, code, aws.ToString(f.Message))
		}
	}
	for i, req := range batch {
		if !answered[i] {
			results[i] = errors.New("sqs: ack message " + req.msg.BrokerID + ": DeleteMessageBatch gave no result for it")
		}
		req.err <- results[i]
	}
}

// close sends what is queued and waits for every call.
func (d *deleter) close() {
	d.mu.Lock()
	if !d.closed {
		d.closed = true
		close(d.in)
	}
	d.mu.Unlock()
	<-d.done
	d.calls.Wait()
}
