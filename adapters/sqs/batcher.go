package sqs

import (
	"context"
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

// batchTimeout bounds one batch call, which serves several callers and so
// cannot take one's ctx.
const batchTimeout = 30 * time.Second

// batcher makes calls on receipts in batch calls of up to 10 entries
// (DeleteMessageBatch, ChangeMessageVisibilityBatch), each sent once full
// or linger after its first entry; each entry gets its own result.
type batcher struct {
	s      *Source
	linger time.Duration
	call   func(ctx context.Context, batch []*batchReq) (ok []string, failed []types.BatchResultErrorEntry, err error)
	in     chan *batchReq
	mu     sync.RWMutex // held to send on in; Lock to close it
	closed bool
	done   chan struct{} // closed when run returned
	calls  sync.WaitGroup
}

// batchReq is one entry of a batch call.
type batchReq struct {
	op   string // "ack", "nack", … for errors
	msg  *ackwise.Message
	r    *receipt
	secs int32      // the visibility timeout to set, for a visibility change
	err  chan error // buffered: the result
}

func newBatcher(s *Source, linger time.Duration, call func(context.Context, []*batchReq) ([]string, []types.BatchResultErrorEntry, error)) *batcher {
	b := &batcher{s: s, linger: linger, call: call, in: make(chan *batchReq, 4*maxBatch), done: make(chan struct{})}
	go b.run()
	return b
}

// newDeleter returns the batcher of deletes.
func newDeleter(s *Source, linger time.Duration) *batcher {
	return newBatcher(s, linger, func(ctx context.Context, batch []*batchReq) ([]string, []types.BatchResultErrorEntry, error) {
		entries := make([]types.DeleteMessageBatchRequestEntry, len(batch))
		for i, req := range batch {
			entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(req.r.handle)}
		}
		out, err := s.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(s.queueURL), Entries: entries})
		if err != nil {
			return nil, nil, err
		}
		return ids(out.Successful, func(e types.DeleteMessageBatchResultEntry) *string { return e.Id }), out.Failed, nil
	})
}

// newVisibility returns the batcher of visibility changes.
func newVisibility(s *Source, linger time.Duration) *batcher {
	return newBatcher(s, linger, func(ctx context.Context, batch []*batchReq) ([]string, []types.BatchResultErrorEntry, error) {
		entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(batch))
		for i, req := range batch {
			entries[i] = types.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(req.r.handle), VisibilityTimeout: req.secs}
		}
		out, err := s.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(s.queueURL), Entries: entries})
		if err != nil {
			return nil, nil, err
		}
		return ids(out.Successful, func(e types.ChangeMessageVisibilityBatchResultEntry) *string { return e.Id }), out.Failed, nil
	})
}

// ids returns the entry IDs of a batch call's successful entries.
func ids[E any](entries []E, id func(E) *string) []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = aws.ToString(id(e))
	}
	return out
}

// do makes the call op on msg (with visibility secs, for a visibility
// change) and waits for its result.
func (b *batcher) do(ctx context.Context, op string, msg *ackwise.Message, r *receipt, secs int32) error {
	return b.wait(ctx, b.add(op, msg, r, secs))
}

// add queues the call op on msg.
func (b *batcher) add(op string, msg *ackwise.Message, r *receipt, secs int32) *batchReq {
	req := &batchReq{op: op, msg: msg, r: r, secs: secs, err: make(chan error, 1)}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		req.err <- fmt.Errorf("sqs: %s message %s: %w; the queue redelivers it: %w", op, msg.BrokerID, adapters.ErrClosed, adapters.ErrReceiptInvalid)
		return req
	}
	b.in <- req
	return req
}

// wait returns the result of req, or ctx's error if ctx ends first (the
// call may still be made).
func (b *batcher) wait(ctx context.Context, req *batchReq) error {
	select {
	case err := <-req.err:
		return err
	case <-ctx.Done():
		return fmt.Errorf("sqs: %s message %s: not confirmed: %w", req.op, req.msg.BrokerID, ctx.Err())
	}
}

func (b *batcher) run() {
	defer close(b.done)
	for {
		req, ok := <-b.in
		if !ok {
			return
		}
		batch := []*batchReq{req}
		var t *time.Timer
		var timeout <-chan time.Time
		if b.linger > 0 {
			t = time.NewTimer(b.linger)
			timeout = t.C
		}
	fill:
		for len(batch) < maxBatch {
			select {
			case req, ok := <-b.in:
				if !ok {
					break fill
				}
				batch = append(batch, req)
			default:
				if timeout == nil {
					break fill
				}
				select {
				case req, ok := <-b.in:
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
		b.calls.Add(1)
		go b.flush(batch)
	}
}

// flush makes one call for batch and hands each entry its result: SQS's
// error for that entry alone (an invalid or expired receipt wraps
// adapters.ErrReceiptInvalid), or the call's for all.
func (b *batcher) flush(batch []*batchReq) {
	defer b.calls.Done()
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	ok, failed, err := b.call(ctx, batch)
	results := make([]error, len(batch))
	answered := make([]bool, len(batch))
	index := func(id *string) (int, bool) {
		i, err := strconv.Atoi(aws.ToString(id))
		return i, err == nil && i >= 0 && i < len(batch)
	}
	for _, id := range ok {
		if i, found := index(&id); found {
			answered[i] = true
		}
	}
	for _, f := range failed {
		i, found := index(f.Id)
		if !found {
			continue
		}
		answered[i] = true
		req, code := batch[i], aws.ToString(f.Code)
		if receiptGone(code) {
			results[i] = fmt.Errorf("sqs: %s message %s: %s, the queue redelivers it: %w", req.op, req.msg.BrokerID, code, adapters.ErrReceiptInvalid)
		} else {
			results[i] = fmt.Errorf("sqs: %s message %s on %s: %s: %s", req.op, req.msg.BrokerID, b.s.name, code, aws.ToString(f.Message))
		}
	}
	for i, req := range batch {
		switch {
		case err != nil:
			results[i] = b.s.settleErr(req.op, req.msg, err)
		case !answered[i]:
			results[i] = fmt.Errorf("sqs: %s message %s: the batch call gave no result for it", req.op, req.msg.BrokerID)
		}
		req.err <- results[i]
	}
}

// close sends what is queued and waits for every call.
func (b *batcher) close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.in)
	}
	b.mu.Unlock()
	<-b.done
	b.calls.Wait()
}
