package sqs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/internal/logbuf"
	"github.com/ackwise/ackwise/retry"
)

// setRedrivePolicy gives queue q a RedrivePolicy moving messages to dq
// after maxReceives receives.
func setRedrivePolicy(t testing.TB, c *sqs.Client, q, dq string, maxReceives int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	arn, err := queueARN(ctx, c, dq)
	if err != nil {
		t.Fatal(err)
	}
	policy := fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":%d}`, arn, maxReceives)
	if _, err := c.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{QueueUrl: aws.String(q), Attributes: map[string]string{"RedrivePolicy": policy}}); err != nil {
		t.Fatal(err)
	}
}

// setRetention sets queue q's MessageRetentionPeriod.
func setRetention(t testing.TB, c *sqs.Client, q string, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{QueueUrl: aws.String(q), Attributes: map[string]string{"MessageRetentionPeriod": strconv.Itoa(int(d / time.Second))}}); err != nil {
		t.Fatal(err)
	}
}

func TestDeadLetterModeConfig(t *testing.T) {
	const q = "https://h/1/q"
	for _, c := range []struct {
		cfg  Config
		want string // "" when valid
	}{
		{Config{QueueURL: q}, ""},
		{Config{QueueURL: q, DeadLetters: DeadLetterBroker}, ""},
		{Config{QueueURL: q, DeadLetters: DeadLetterBroker, MaxAttempts: 7}, ""},
		{Config{QueueURL: q, DeadLetters: DeadLetterAckwise, DeadLetterQueueURL: "https://h/1/d", MaxAttempts: retry.Unlimited}, ""},
		{Config{QueueURL: q, DeadLetters: "sqs"}, `Config.DeadLetters = "sqs"`},
		{Config{QueueURL: q, DeadLetters: DeadLetterBroker, DeadLetterQueueURL: "https://h/1/d"}, "Config.DeadLetterQueueURL is for ackwise-managed dead letters"},
		{Config{QueueURL: q, DeadLetters: DeadLetterBroker, MaxAttempts: retry.Unlimited}, "Config.MaxAttempts = -1 (unlimited)"},
		{Config{QueueURL: q, MaxAttempts: -2}, "Config.MaxAttempts = -2"},
	} {
		err := c.cfg.validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.cfg, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: error %v, want one saying %q", c.cfg, err, c.want)
		}
	}
	for _, c := range []struct {
		policy string
		arn    string
		max    int
		ok     bool
		bad    bool
	}{
		{"", "", 0, false, false},
		{`{"deadLetterTargetArn":"arn:aws:sqs:r:1:d","maxReceiveCount":5}`, "arn:aws:sqs:r:1:d", 5, true, false},
		{`{"deadLetterTargetArn":"arn:aws:sqs:r:1:d","maxReceiveCount":"12"}`, "arn:aws:sqs:r:1:d", 12, true, false},
		{`{"deadLetterTargetArn":"arn:aws:sqs:r:1:d","maxReceiveCount":0}`, "", 0, true, true},
		{`{"deadLetterTargetArn":"d","maxReceiveCount":3}`, "", 0, true, true},
		{`{not json`, "", 0, true, true},
	} {
		arn, n, ok, err := parseRedrivePolicy(c.policy)
		if arn != c.arn || n != c.max || ok != c.ok || (err != nil) != c.bad {
			t.Errorf("parseRedrivePolicy(%q) = %q, %d, %v, %v", c.policy, arn, n, ok, err)
		}
	}
}

// TestBrokerModeAgreement: with broker-managed dead letters the source
// refuses a queue whose RedrivePolicy's maxReceiveCount is not the
// consumer's max attempts, naming both numbers, and a queue without a
// RedrivePolicy; it opens where they agree (0 meaning the retry package's
// default), and says so in its Capabilities.
func TestBrokerModeAgreement(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	conn := testConn(t)
	q := createQueue(t, c, "agree", 0, false)
	bare := createQueue(t, c, "agree-bare", 0, false)
	dq := createQueue(t, c, "agree-dlq", 0, false)
	setRedrivePolicy(t, c, q, dq, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open := func(queue string, maxAttempts int) (*Source, error) {
		src, err := NewSource(ctx, Config{QueueURL: queue, Connection: conn, DeadLetters: DeadLetterBroker, MaxAttempts: maxAttempts, WaitTime: -1})
		if err == nil {
			t.Cleanup(func() { src.Close() })
		}
		return src, err
	}
	for _, c := range []struct {
		queue string
		max   int
		want  []string
	}{
		{q, 5, []string{"maxReceiveCount 3", "max attempts (Config.MaxAttempts, URL parameter max_attempts) are 5"}},
		{q, 0, []string{"maxReceiveCount 3", "are 5"}}, // 0: retry.DefaultMaxAttempts
		{q, 2, []string{"maxReceiveCount 3", "are 2"}},
		{bare, 3, []string{"has no RedrivePolicy", "maxReceiveCount 3"}},
	} {
		_, err := open(c.queue, c.max)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("MaxAttempts %d on %s: error %v, want one saying %q", c.max, queueName(c.queue), err, w)
			}
		}
	}
	src, err := open(q, 3)
	if err != nil {
		t.Fatal(err)
	}
	if caps := src.Capabilities(); !caps.BrokerDeadLetters {
		t.Errorf("Capabilities %+v: want BrokerDeadLetters", caps)
	}
	// The consumer checks its own max attempts against the policy too
	// (adapters.AttemptsChecker), whatever the source was configured with:
	// its default 5 is refused naming both, 3 is taken.
	noop := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil })
	if _, err := consumer.New(src, noop, consumer.Config{}); err == nil || !strings.Contains(err.Error(), "maxReceiveCount 3") || !strings.Contains(err.Error(), "max attempts are 5") {
		t.Errorf("consumer.New with the default max attempts: %v, want a refusal naming 3 and 5", err)
	}
	if _, err := consumer.New(src, noop, consumer.Config{Retry: retry.Policy{MaxAttempts: 3}}); err != nil {
		t.Errorf("consumer.New with max attempts 3: %v", err)
	}
	// A URL says the same.
	u := strings.Replace(q, "http://", "awssqs://", 1) + "?endpoint=" + conn.Endpoint + "&dlq_mode=broker&max_attempts=4&wait=-1"
	if _, err := adapters.OpenSource(ctx, u); err == nil || !strings.Contains(err.Error(), "maxReceiveCount 3") || !strings.Contains(err.Error(), "are 4") {
		t.Errorf("open %s: %v, want a refusal naming 3 and 4", u, err)
	}
}

// TestRetentionWarning: in either dead-letter mode the source warns when
// the dead-letter queue keeps messages for less time than the queue, with
// both periods, and not when it keeps them longer.
func TestRetentionWarning(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	conn := testConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, mode := range []DeadLetterMode{DeadLetterAckwise, DeadLetterBroker} {
		for _, dlqRetention := range []time.Duration{time.Hour, 14 * 24 * time.Hour} {
			q := createQueue(t, c, "retention", 0, false)
			dq := createQueue(t, c, "retention-dlq", 0, false)
			setRetention(t, c, q, 4*24*time.Hour)
			setRetention(t, c, dq, dlqRetention)
			cfg := Config{QueueURL: q, Connection: conn, DeadLetters: mode, WaitTime: -1}
			if mode == DeadLetterBroker {
				setRedrivePolicy(t, c, q, dq, retry.DefaultMaxAttempts)
			} else {
				cfg.DeadLetterQueueURL = dq
			}
			var logged logbuf.Buffer
			cfg.Logger = slog.New(slog.NewTextHandler(&logged, nil))
			src, err := NewSource(ctx, cfg)
			if err != nil {
				t.Fatalf("%s: %v", mode, err)
			}
			src.Close()
			warned := strings.Contains(logged.String(), "keeps messages for less time than the queue")
			switch {
			case dlqRetention == time.Hour && (!warned || !strings.Contains(logged.String(), "retention=96h0m0s dlq_retention=1h0m0s")):
				t.Errorf("%s, dead-letter retention %v: want a warning naming 96h and 1h, logged:\n%s", mode, dlqRetention, logged.String())
			case dlqRetention > time.Hour && warned:
				t.Errorf("%s, dead-letter retention %v: a warning, logged:\n%s", mode, dlqRetention, logged.String())
			}
		}
	}
}

// TestPoisonDeadLetteredBothModes: a poison message is dead-lettered after
// its receives in both modes.
//
// ackwise: the engine handles it MaxAttempts times, each a new receive,
// and writes it to the dead-letter queue with every envelope header, its 12
// headers (packed past SQS's 10 attributes) and its body byte for byte.
//
// broker: the engine sends nothing; each failure hands the message back,
// and SQS's RedrivePolicy moves it, without an envelope, with its body and
// attributes as published, marked DeadLetterQueueSourceArn by SQS. Cases:
// a permanent failure with maxReceiveCount 3 (handled again until SQS
// moves it) and exhausted retries with maxReceiveCount 1.
func TestPoisonDeadLetteredBothModes(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	conn := testConn(t)
	headers := ackwise.HeadersOf("x-tenant", "acme", "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	for i := range 10 {
		headers.Set(fmt.Sprint("x-extra-", i), fmt.Sprint("v", i))
	}
	body := []byte{0xde, 0xad, 0, 0xbe, 0xef, '\n'}
	publish := func(ctx context.Context, t *testing.T, q string) *ackwise.Message {
		sink, err := NewSink(ctx, SinkConfig{QueueURL: q, Connection: conn})
		if err != nil {
			t.Fatal(err)
		}
		m := &ackwise.Message{ID: "poison-" + randSuffix(), Key: "acct-7", Payload: body, Headers: headers.Clone()}
		if err := sink.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	// run runs the engine on src until the dead-letter queue dq holds a
	// message, and returns it and the attempts the handler saw.
	run := func(ctx context.Context, t *testing.T, src adapters.Source, dq string, cfg consumer.Config, fail error) ([]int, *rawDead) {
		var mu sync.Mutex
		var attempts []int
		cons, err := consumer.New(src, ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
			mu.Lock()
			attempts = append(attempts, m.Attempt)
			mu.Unlock()
			return fail
		}), cfg)
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- cons.Run(runCtx) }()
		var dead []*rawDead
		for len(dead) == 0 && ctx.Err() == nil {
			dead = drainRaw(ctx, t, c, dq)
			if len(dead) == 0 {
				time.Sleep(50 * time.Millisecond) // a queue offers nothing to wait on
			}
		}
		stop()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(dead) != 1 {
			t.Fatalf("%d dead letters, want 1 (handled at attempts %v)", len(dead), attempts)
		}
		return attempts, dead[0]
	}
	empty := func(ctx context.Context, t *testing.T, q string) {
		out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(q), AttributeNames: backlogAttributes})
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range backlogAttributes {
			if out.Attributes[string(k)] != "0" {
				t.Errorf("%s = %s on %s after the run, want 0", k, out.Attributes[string(k)], queueName(q))
			}
		}
	}

	t.Run("ackwise", func(t *testing.T) {
		t.Parallel()
		const attempts = 3
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()
		q := createQueue(t, c, "poison", 10*time.Second, false)
		dq := createQueue(t, c, "poison-dlq", 0, false)
		m := publish(ctx, t, q)
		src, err := NewSource(ctx, Config{QueueURL: q, DeadLetterQueueURL: dq, Connection: conn, WaitTime: time.Second, MaxAttempts: attempts})
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		cfg := consumer.Config{Name: "billing", Version: "v1.2.3", Retry: retry.Policy{MaxAttempts: attempts, InitialInterval: time.Second, Multiplier: 1, Jitter: retry.NoJitter}}
		seen, d := run(ctx, t, fixedSource{src, newCountFix()}, dq, cfg, errors.New("ledger says no"))
		if !slices.Equal(seen, []int{1, 2, 3}) {
			t.Errorf("handled at attempts %v, want [1 2 3]", seen)
		}
		dm := (&Source{name: queueName(dq), lease: time.Minute}).message(d.raw, 0)
		env, err := dlq.Decode(dm.Headers)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case !bytes.Equal(dm.Payload, body):
			t.Errorf("payload %q, want %q", dm.Payload, body)
		case dm.ID != m.ID || dm.Key != m.Key:
			t.Errorf("dead letter %s key %q, want %s %q", dm.ID, dm.Key, m.ID, m.Key)
		case env.Reason != dlq.ReasonMaxAttempts || env.Error != "ledger says no" || env.ErrorClass != ackwise.ClassTransient.String():
			t.Errorf("envelope %+v", env)
		case env.Source != queueName(q) || env.MessageID == "" || env.MessageID == aws.ToString(d.raw.MessageId) || env.Partition != -1 || env.Offset != -1:
			t.Errorf("envelope %+v", env)
		case env.Attempts != attempts || env.Consumer != "billing" || env.ConsumerVersion != "v1.2.3" || !env.FirstFailure.Before(env.LastFailure):
			t.Errorf("envelope %+v", env)
		}
		for _, k := range headers.Keys() {
			if got := dm.Headers.Get(k); got != headers.Get(k) {
				t.Errorf("header %s = %q, want %q", k, got, headers.Get(k))
			}
		}
		if n := len(d.raw.MessageAttributes); n > 10 || d.raw.MessageAttributes[AttrHeaders].StringValue == nil {
			t.Errorf("%d attributes, want at most 10 with %s packing the rest", n, AttrHeaders)
		}
		empty(ctx, t, q)
	})

	for _, bc := range []struct {
		name        string
		maxReceives int
		fail        error
		// want is the attempts the handler sees. The emulator counts each
		// ChangeMessageVisibility as a receive (countFix) and moves a
		// message whose count reached maxReceiveCount when its
		// visibility ends: a handback at receive 1 brings it to 2, the
		// next receive to 3. AWS counts receives only and moves on the
		// receive after the maxReceiveCount-th, so there a permanent
		// failure is handled [1 2 3] times; with maxReceiveCount 1 the
		// two agree.
		want []int
	}{
		{"broker/permanent", 3, ackwise.Permanent(errors.New("unknown account")), []int{1, 3}},
		{"broker/max-attempts", 1, errors.New("ledger timed out"), []int{1}},
	} {
		t.Run(bc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			q := createQueue(t, c, "poison", 10*time.Second, false)
			dq := createQueue(t, c, "poison-dlq", 0, false)
			setRedrivePolicy(t, c, q, dq, bc.maxReceives)
			m := publish(ctx, t, q)
			var logged logbuf.Buffer
			src, err := NewSource(ctx, Config{QueueURL: q, Connection: conn, WaitTime: time.Second, DeadLetters: DeadLetterBroker, MaxAttempts: bc.maxReceives, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			cfg := consumer.Config{Name: "billing", Retry: retry.Policy{MaxAttempts: bc.maxReceives, InitialInterval: time.Second, Jitter: retry.NoJitter}}
			seen, d := run(ctx, t, src, dq, cfg, bc.fail)
			if !slices.Equal(seen, bc.want) {
				t.Errorf("handled at attempts (ApproximateReceiveCount) %v, want %v", seen, bc.want)
			}
			dm := (&Source{name: queueName(dq), lease: time.Minute}).message(d.raw, 0)
			srcARN, err := queueARN(ctx, c, q)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case d.raw.Attributes["DeadLetterQueueSourceArn"] != srcARN:
				t.Errorf("DeadLetterQueueSourceArn %q, want %q: SQS did not move it", d.raw.Attributes["DeadLetterQueueSourceArn"], srcARN)
			case !bytes.Equal(dm.Payload, body) || dm.ID != m.ID || dm.Key != m.Key:
				t.Errorf("dead letter %s key %q payload %q, want %s %q %q", dm.ID, dm.Key, dm.Payload, m.ID, m.Key, body)
			case dm.Headers.Has(dlq.HeaderReason):
				t.Errorf("a broker-managed dead letter has an envelope: %v", dm.Headers)
			}
			for _, k := range headers.Keys() {
				if got := dm.Headers.Get(k); got != headers.Get(k) {
					t.Errorf("header %s = %q, want %q", k, got, headers.Get(k))
				}
			}
			if n := strings.Count(logged.String(), "handed back to the queue's RedrivePolicy"); n != len(bc.want) || !strings.Contains(logged.String(), "broker_id=") {
				t.Errorf("%d hand-back warnings, want %d with the message ID:\n%s", n, len(bc.want), logged.String())
			}
			empty(ctx, t, q)
		})
	}
}

// rawDead is a message drained from a dead-letter queue as SQS gave it.
type rawDead struct{ raw types.Message }

// drainRaw receives and deletes what queueURL holds now.
func drainRaw(ctx context.Context, t testing.TB, c *sqs.Client, queueURL string) []*rawDead {
	t.Helper()
	var out []*rawDead
	for {
		in := awsReceive(queueURL).ReceiveMessageInput
		in.MessageSystemAttributeNames = []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}
		res, err := c.ReceiveMessage(ctx, &in)
		if err != nil {
			t.Fatalf("receive from %s: %v", queueName(queueURL), err)
		}
		if len(res.Messages) == 0 {
			return out
		}
		for _, m := range res.Messages {
			out = append(out, &rawDead{raw: m})
			if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(queueURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatalf("delete from %s: %v", queueName(queueURL), err)
			}
		}
	}
}
