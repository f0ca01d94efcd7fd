package sqs

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// Limits and defaults of MoveTask.
const (
	// MaxMoveRate is SQS's highest MaxNumberOfMessagesPerSecond.
	MaxMoveRate = 500
	// DefaultMovePoll is how often MoveTask reads the task's progress.
	DefaultMovePoll = time.Second
)

// Move task statuses, as ListMessageMoveTasks reports them.
const (
	MoveRunning    = "RUNNING"
	MoveCompleted  = "COMPLETED"
	MoveCancelling = "CANCELLING"
	MoveCancelled  = "CANCELLED"
	MoveFailed     = "FAILED"
)

// MoveOptions tunes MoveTask.
type MoveOptions struct {
	// MaxPerSecond caps the rate SQS moves messages at
	// (MaxNumberOfMessagesPerSecond), 1 to MaxMoveRate. Zero lets SQS
	// choose the rate by the backlog.
	MaxPerSecond int
	// Poll is how often the task's progress is read
	// (ListMessageMoveTasks). Zero means DefaultMovePoll.
	Poll time.Duration
	// Progress, when set, is called with each progress read, from
	// MoveTask's goroutine.
	Progress func(MoveResult)
}

// MoveResult is what a move task did, by SQS's approximate counts.
type MoveResult struct {
	// Status is the task's last status: MoveCompleted, MoveCancelled,
	// MoveFailed, or MoveRunning / MoveCancelling when MoveTask returned
	// before the task ended.
	Status string
	// Moved is ApproximateNumberOfMessagesMoved.
	Moved int64
	// ToMove is ApproximateNumberOfMessagesToMove: what the dead-letter
	// queue held as the task started (-1 until SQS says).
	ToMove int64
	// MaxPerSecond is the rate cap SQS reports for the task (0: none).
	MaxPerSecond int
	// FailureReason is SQS's reason of a failed task.
	FailureReason string
	// Elapsed is the time from the start to the last progress read.
	Elapsed time.Duration
}

// MoveTask moves the messages of the dead-letter queue dlqURL to the queue
// targetURL with SQS's own move task (StartMessageMoveTask), at most
// o.MaxPerSecond a second, and waits for it to end, reading its progress
// (ListMessageMoveTasks) every o.Poll. It returns the counts once the task
// completed; an error when it failed (with SQS's reason), was cancelled by
// someone else, or ctx ended first: then MoveTask cancels the task
// (CancelMessageMoveTask); the messages moved so far stay moved, the rest
// stay in the dead-letter queue.
//
// SQS moves out of a queue that is the dead-letter queue of another (a
// RedrivePolicy names it) and into a queue of the same type (standard or
// FIFO); targetURL is passed as the DestinationArn, the original source
// queue or any other, as AWS allows. SQS moves each message as it holds
// it, with a new message ID: no filter, no count of redrives, and a
// dead letter that ackwise wrote (Config.DeadLetters = DeadLetterAckwise)
// keeps its envelope attributes on the target; dlq.Redrive (ackwise dlq
// redrive without --native) strips them. Only one move task may run per
// dead-letter queue at a time. The queues must be in the region and
// endpoint of c.
func MoveTask(ctx context.Context, c Connection, dlqURL, targetURL string, o MoveOptions) (MoveResult, error) {
	res := MoveResult{ToMove: -1}
	if err := checkQueueURL("dead-letter queue URL", dlqURL); err != nil {
		return res, err
	}
	if err := checkQueueURL("target queue URL", targetURL); err != nil {
		return res, err
	}
	switch {
	case dlqURL == targetURL:
		return res, fmt.Errorf("sqs: move task: the dead-letter queue and the target are the same queue (%s)", queueName(dlqURL))
	case isFIFO(dlqURL) != isFIFO(targetURL):
		return res, fmt.Errorf("sqs: move task: %s and %s are not both FIFO or both standard queues: SQS moves between queues of one type", queueName(dlqURL), queueName(targetURL))
	case o.MaxPerSecond < 0 || o.MaxPerSecond > MaxMoveRate:
		return res, fmt.Errorf("sqs: MoveOptions.MaxPerSecond = %d: want 1 to %d, or 0 (SQS's choice)", o.MaxPerSecond, MaxMoveRate)
	case o.Poll < 0:
		return res, fmt.Errorf("sqs: MoveOptions.Poll = %v: want > 0, or 0 (default %v)", o.Poll, DefaultMovePoll)
	}
	if o.Poll == 0 {
		o.Poll = DefaultMovePoll
	}
	client, err := c.newClient(ctx, dlqURL)
	if err != nil {
		return res, err
	}
	src, err := queueARN(ctx, client, dlqURL)
	if err != nil {
		return res, err
	}
	dst, err := queueARN(ctx, client, targetURL)
	if err != nil {
		return res, err
	}
	in := &sqs.StartMessageMoveTaskInput{SourceArn: aws.String(src), DestinationArn: aws.String(dst)}
	if o.MaxPerSecond > 0 {
		in.MaxNumberOfMessagesPerSecond = aws.Int32(int32(o.MaxPerSecond))
	}
	start := time.Now()
	out, err := client.StartMessageMoveTask(ctx, in)
	if err != nil {
		return res, fmt.Errorf("sqs: start a move task from %s to %s (is %s named by a queue's RedrivePolicy? is another move task running?): %w", queueName(dlqURL), queueName(targetURL), queueName(dlqURL), err)
	}
	t := &moveWatch{client: client, src: src, dst: dst, handle: aws.ToString(out.TaskHandle), start: start}
	tick := time.NewTicker(o.Poll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return t.cancel(res, ctx.Err())
		case <-tick.C:
		}
		e, err := t.read(ctx)
		switch {
		case ctx.Err() != nil:
			return t.cancel(res, ctx.Err())
		case err != nil:
			return res, err
		case e == nil:
			continue // not listed yet
		}
		res = result(e, start)
		if o.Progress != nil {
			o.Progress(res)
		}
		switch res.Status {
		case MoveCompleted:
			return res, nil
		case MoveFailed:
			return res, fmt.Errorf("sqs: the move task from %s to %s failed after moving %d: %s", queueName(dlqURL), queueName(targetURL), res.Moved, res.FailureReason)
		case MoveCancelled, MoveCancelling:
			return res, fmt.Errorf("sqs: the move task from %s to %s was cancelled after moving %d", queueName(dlqURL), queueName(targetURL), res.Moved)
		}
	}
}

// moveWatch finds a move task in ListMessageMoveTasks.
type moveWatch struct {
	client   *sqs.Client
	src, dst string
	handle   string
	start    time.Time
	started  int64 // the task's StartedTimestamp, once seen
}

// read returns the task's entry, or nil when it is not listed yet. SQS
// lists a task's handle only while it runs: once it has seen the task
// running, read knows it by its StartedTimestamp; a task it never saw
// running is the most recent one to the same destination.
func (w *moveWatch) read(ctx context.Context) (*types.ListMessageMoveTasksResultEntry, error) {
	out, err := w.client.ListMessageMoveTasks(ctx, &sqs.ListMessageMoveTasksInput{SourceArn: aws.String(w.src), MaxResults: aws.Int32(10)})
	if err != nil {
		return nil, fmt.Errorf("sqs: read the progress of the move task: %w", err)
	}
	for i, e := range out.Results {
		switch {
		case aws.ToString(e.TaskHandle) == w.handle:
			w.started = e.StartedTimestamp
			return &out.Results[i], nil
		case w.started != 0 && e.StartedTimestamp == w.started:
			return &out.Results[i], nil
		}
	}
	if w.started == 0 && len(out.Results) > 0 {
		// Ended before read saw it: the most recent task (listed first),
		// as no other can start while it runs.
		if e := out.Results[0]; aws.ToString(e.DestinationArn) == w.dst && aws.ToString(e.Status) != MoveRunning {
			w.started = e.StartedTimestamp
			return &out.Results[0], nil
		}
	}
	return nil, nil
}

// cancel cancels the task as ctx ended (cause), and returns res with
// cause.
func (w *moveWatch) cancel(res MoveResult, cause error) (MoveResult, error) {
	ctx, done := context.WithTimeout(context.Background(), 10*time.Second)
	defer done()
	out, err := w.client.CancelMessageMoveTask(ctx, &sqs.CancelMessageMoveTaskInput{TaskHandle: aws.String(w.handle)})
	switch {
	case err == nil:
		res.Moved, res.Status = out.ApproximateNumberOfMessagesMoved, MoveCancelling
	case errorCode(err) == "":
		// Not SQS's answer (that the task ended meanwhile) but no answer.
		return res, fmt.Errorf("sqs: move task stopped (%w), and cancelling it failed: it may still run: %w", cause, err)
	}
	return res, fmt.Errorf("sqs: move task cancelled after moving %d: %w", res.Moved, cause)
}

// result is the MoveResult of a listed task started at start.
func result(e *types.ListMessageMoveTasksResultEntry, start time.Time) MoveResult {
	r := MoveResult{
		Status:        aws.ToString(e.Status),
		Moved:         e.ApproximateNumberOfMessagesMoved,
		ToMove:        -1,
		FailureReason: aws.ToString(e.FailureReason),
		Elapsed:       time.Since(start),
	}
	if e.ApproximateNumberOfMessagesToMove != nil {
		r.ToMove = *e.ApproximateNumberOfMessagesToMove
	}
	if e.MaxNumberOfMessagesPerSecond != nil {
		r.MaxPerSecond = int(*e.MaxNumberOfMessagesPerSecond)
	}
	return r
}

// queueARN returns the ARN of the queue of queueURL.
func queueARN(ctx context.Context, client *sqs.Client, queueURL string) (string, error) {
	const attr = types.QueueAttributeNameQueueArn
	out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queueURL), AttributeNames: []types.QueueAttributeName{attr}})
	if err != nil {
		return "", fmt.Errorf("sqs: read the ARN of queue %s: %w", queueName(queueURL), err)
	}
	arn := out.Attributes[string(attr)]
	if _, _, ok := queueOfARN(arn); !ok {
		return "", fmt.Errorf("sqs: queue %s has QueueArn %q, not an SQS queue ARN", queueName(queueURL), arn)
	}
	return arn, nil
}
