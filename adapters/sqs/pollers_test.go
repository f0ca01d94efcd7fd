package sqs

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	smithymw "github.com/aws/smithy-go/middleware"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
)

// callWatch is a middleware on the SDK client under test that follows its
// receives and deletes: how many ReceiveMessage calls are under way at
// once, and how many messages the client holds (received, not yet deleted)
// plus those the receives under way asked for.
type callWatch struct {
	mu        sync.Mutex
	receiving int // ReceiveMessage calls under way
	asked     int // messages they asked for
	held      int // received, not deleted
	maxRecv   int
	maxExpose int // the most of held+asked seen
	want      int // receiving to reach
	reached   chan struct{}
	closed    bool
}

func newCallWatch(want int) *callWatch {
	return &callWatch{want: want, reached: make(chan struct{})}
}

func (w *callWatch) apply(st *smithymw.Stack) error {
	return st.Initialize.Add(smithymw.InitializeMiddlewareFunc("ackwise-test-callwatch", func(ctx context.Context, in smithymw.InitializeInput, next smithymw.InitializeHandler) (smithymw.InitializeOutput, smithymw.Metadata, error) {
		recv, isRecv := in.Parameters.(*sqs.ReceiveMessageInput)
		if isRecv {
			w.mu.Lock()
			w.receiving++
			w.asked += int(recv.MaxNumberOfMessages)
			w.maxRecv = max(w.maxRecv, w.receiving)
			w.maxExpose = max(w.maxExpose, w.held+w.asked)
			if w.receiving == w.want && w.maxRecv == w.want && !w.closed {
				w.closed = true
				close(w.reached)
			}
			w.mu.Unlock()
		}
		out, md, err := next.HandleInitialize(ctx, in)
		w.mu.Lock()
		defer w.mu.Unlock()
		switch res := out.Result.(type) {
		case *sqs.ReceiveMessageOutput:
			if err == nil {
				w.held += len(res.Messages)
			}
		case *sqs.DeleteMessageBatchOutput:
			if err == nil {
				w.held -= len(res.Successful)
			}
		}
		if isRecv {
			w.receiving--
			w.asked -= int(recv.MaxNumberOfMessages)
		}
		return out, md, err
	}), smithymw.Before)
}

// TestPollersConcurrentWithinWindow: with Pollers 4 and an in-flight window
// of 40, four ReceiveMessage calls are under way at once (seen by a
// middleware on the SDK client, on an empty queue where each long-polls),
// and while a backlog drains through 8 workers the messages the client
// holds (received and not deleted) plus those its receives under way ask
// for never exceed the window: no message is received that the engine has
// no place for. Every message is handled once.
func TestPollersConcurrentWithinWindow(t *testing.T) {
	t.Parallel()
	const pollers, window, n = 4, 40, 400
	raw := testClient(t)
	q := createQueue(t, raw, "pollers", 30*time.Second, false)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	watch := newCallWatch(pollers)
	awsCfg.APIOptions = append(awsCfg.APIOptions, watch.apply)
	conn := testConn(t)
	conn.AWS = &awsCfg
	src, err := NewSource(ctx, Config{QueueURL: q, Connection: conn, Pollers: pollers})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()

	var mu sync.Mutex
	handled := map[string]int{}
	allDone := make(chan struct{})
	h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
		// Work that takes a while, so that the window fills.
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		mu.Lock()
		defer mu.Unlock()
		handled[string(m.Payload)]++
		if len(handled) == n {
			close(allDone)
		}
		return nil
	})
	cons, err := consumer.New(src, h, consumer.Config{Concurrency: 8, MaxInFlight: window, ReceiveBatch: window})
	if err != nil {
		t.Fatal(err)
	}
	defer startConsumer(ctx, t, cons)()

	select {
	case <-watch.reached:
	case <-ctx.Done():
		watch.mu.Lock()
		defer watch.mu.Unlock()
		t.Fatalf("at most %d ReceiveMessage calls under way at once, want %d", watch.maxRecv, pollers)
	}

	for i := 0; i < n; i += maxBatch {
		entries := make([]types.SendMessageBatchRequestEntry, maxBatch)
		for j := range entries {
			entries[j] = types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(j)), MessageBody: aws.String("m" + strconv.Itoa(i+j))}
		}
		out, err := raw.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(q), Entries: entries})
		if err != nil || len(out.Failed) > 0 {
			t.Fatalf("send: %v %+v", err, out)
		}
	}
	select {
	case <-allDone:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d of %d messages handled: %+v", len(handled), n, cons.Stats())
	}
	mu.Lock()
	for id, k := range handled {
		if k != 1 {
			t.Errorf("%s handled %d times", id, k)
		}
	}
	mu.Unlock()
	watch.mu.Lock()
	defer watch.mu.Unlock()
	if watch.maxExpose > window {
		t.Errorf("the client held or asked for up to %d messages at once, over the in-flight window of %d", watch.maxExpose, window)
	}
	t.Logf("at most %d receives under way, %d messages held or asked for (window %d)", watch.maxRecv, watch.maxExpose, window)
}

// TestPollersConfig: Pollers out of bounds is refused, naming the field,
// and so is a pollers URL parameter.
func TestPollersConfig(t *testing.T) {
	t.Parallel()
	for _, p := range []int{-1, MaxPollers + 1} {
		err := Config{QueueURL: "https://sqs.us-east-1.amazonaws.com/1/q", Pollers: p}.validate()
		if err == nil || !strings.Contains(err.Error(), "Config.Pollers = "+strconv.Itoa(p)) {
			t.Errorf("Pollers %d: %v", p, err)
		}
	}
	for _, v := range []string{"0", "65", "x", "-1"} {
		u := mustURL(t, "awssqs://sqs.us-east-1.amazonaws.com/1/q?pollers="+v)
		if _, err := ConfigFromURL(u); err == nil || !strings.Contains(err.Error(), `"pollers"`) {
			t.Errorf("pollers=%s: %v", v, err)
		}
	}
	cfg, err := ConfigFromURL(mustURL(t, "awssqs://sqs.us-east-1.amazonaws.com/1/q?pollers=8"))
	if err != nil || cfg.Pollers != 8 {
		t.Fatalf("pollers=8: %d, %v", cfg.Pollers, err)
	}
	if _, err := SinkConfigFromURL(mustURL(t, "awssqs://sqs.us-east-1.amazonaws.com/1/q?pollers=8")); err == nil {
		t.Error("a sink URL took pollers")
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestPollersPerCallContext: a caller that gives each Receive a context of
// its own, ended as the call returns (dlq redrive and inspect do), while
// polls for the rest of its room are still under way. Those polls are not
// cancelled (a long poll cancelled may leave what SQS had handed out
// invisible for the visibility timeout, 30 s here) and what they bring
// goes back to the queue at once, so every message is received, acked
// once, well within one visibility timeout.
func TestPollersPerCallContext(t *testing.T) {
	t.Parallel()
	const n = 100
	raw := testClient(t)
	q := createQueue(t, raw, "pollers-percall", 30*time.Second, false)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	for i := 0; i < n; i += maxBatch {
		entries := make([]types.SendMessageBatchRequestEntry, maxBatch)
		for j := range entries {
			entries[j] = types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(j)), MessageBody: aws.String("m" + strconv.Itoa(i+j))}
		}
		if out, err := raw.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(q), Entries: entries}); err != nil || len(out.Failed) > 0 {
			t.Fatalf("send: %v %+v", err, out)
		}
	}
	src, err := NewSource(ctx, Config{QueueURL: q, Connection: testConn(t), Pollers: 4, WaitTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	seen := map[string]int{}
	buf := make([]*ackwise.Message, 40)
	errs := make([]error, len(buf))
	for len(seen) < n {
		callCtx, done := context.WithTimeout(ctx, 5*time.Second)
		k, err := src.Receive(callCtx, buf)
		done()
		if ctx.Err() != nil {
			t.Fatalf("%d of %d received before the test's deadline (messages left invisible?)", len(seen), n)
		}
		if err != nil && callCtx.Err() == nil {
			t.Fatal(err)
		}
		src.AckBatch(ctx, buf[:k], errs[:k])
		for i, m := range buf[:k] {
			if errs[i] != nil {
				t.Fatalf("ack %s: %v", m.Payload, errs[i])
			}
			seen[string(m.Payload)]++
		}
	}
	for id, c := range seen {
		if c != 1 {
			t.Errorf("%s received %d times", id, c)
		}
	}
}
