package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

const psProject = "ackwise-cli"

// pubsubFake starts pstest with a work topic and subscription and a
// dead-letter topic and subscription, and returns the server, an admin
// client and the gcppubsub:// URLs: the work subscription (a source, with
// dead_letter_topic=), the dead-letter subscription (the CLI's source)
// and the work topic (a sink: the redrive's target).
func pubsubFake(t *testing.T, ctx context.Context) (srv *pstest.Server, admin *pubsub.Client, work, dead, target string) {
	t.Helper()
	srv = pstest.NewServer()
	t.Cleanup(func() { srv.Close() })
	admin, err := pubsub.NewClient(ctx, psProject, option.WithEndpoint(srv.Addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())), option.WithTelemetryDisabled())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	p := "projects/" + psProject
	for _, n := range []string{"work", "dead"} {
		if _, err := admin.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: p + "/topics/" + n}); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: p + "/subscriptions/" + n, Topic: p + "/topics/" + n, AckDeadlineSeconds: 10}); err != nil {
			t.Fatal(err)
		}
	}
	base := "gcppubsub://" + p
	q := "?emulator=" + srv.Addr
	// The CLI reads the dead-letter subscription asking for a 10 s ack
	// deadline: a dead letter in transit to a client that closed (a
	// release at the end of a run) comes back after 10 s, not after the
	// client's default 60 s.
	return srv, admin, base + "/subscriptions/work" + q + "&dead_letter_topic=dead", base + "/subscriptions/dead" + q + "&ack_deadline=10s", base + "/topics/work" + q
}

// pubsubHeld counts the messages published to topic that pstest holds
// unacked.
func pubsubHeld(srv *pstest.Server, topic string) int {
	n := 0
	for _, m := range srv.Messages() {
		if m.Topic == "projects/"+psProject+"/topics/"+topic && m.Acks == 0 {
			n++
		}
	}
	return n
}

// TestPubSubStatsAndRedrive: the engine, on a Pub/Sub source whose handler
// fails permanently, dead-letters 20 messages to the dead-letter topic
// (ackwise-managed); the CLI inspects them on the dead-letter
// subscription, stats says the depth is unknown (Pub/Sub's data plane has
// no count) and counts the sample (20 dead letters, nothing consumed), and
// redrive moves all 20 back to the work topic: the work subscription then
// holds the 20 events, whole, on their key and without envelope, and the
// dead-letter subscription nothing.
func TestPubSubStatsAndRedrive(t *testing.T) {
	t.Parallel()
	const n = 20 // pstest hands out about 90 messages a second per stream
	// Generous: on a busy machine a stranded dead letter costs a redrive
	// run its 10 s ack deadline (see pubsubFake).
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	srv, _, work, dead, target := pubsubFake(t, ctx)
	sink, err := adapters.OpenSink(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	msgs := make([]*ackwise.Message, n)
	for i := range msgs {
		msgs[i] = &ackwise.Message{ID: fmt.Sprint("e", i), Key: "k", Payload: []byte(fmt.Sprint("payload-", i)), Headers: ackwise.HeadersOf("x-tenant", "acme")}
	}
	if err := sink.Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}

	src, err := adapters.OpenSource(ctx, work)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := consumer.New(src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		return ackwise.Permanent(errors.New("bad input"))
	}), consumer.Config{Name: "billing", Concurrency: 8})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cons.Run(runCtx) }()
	// A topic offers nothing to wait on: poll what pstest holds.
	for pubsubHeld(srv, "dead") < n || pubsubHeld(srv, "work") > 0 {
		if ctx.Err() != nil {
			t.Fatalf("%d dead letters, %d unacked at work; want %d and 0", pubsubHeld(srv, "dead"), pubsubHeld(srv, "work"), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}

	// Stats first: the dead-letter subscription was never read, so no
	// message is in transit to a closing client (such a message comes back
	// only after its ack deadline, 10s), and the sample is all 20.
	code, out, errOut := ackwiseRun(t, "dlq", "stats", dead, "-n", "100", "-idle", "2s")
	if code != exitOK || !strings.HasPrefix(out, "depth: unknown ") ||
		!strings.Contains(out, fmt.Sprintf("sample: %d messages (dead letters: %d, without envelope: 0)\n", n, n)) ||
		!strings.Contains(out, fmt.Sprintf("event IDs: %d distinct (copies: 0;", n)) || !strings.Contains(out, "  permanent ") {
		t.Fatalf("stats: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, out, errOut = ackwiseRun(t, "dlq", "stats", dead, "-json", "-n", "5", "-idle", "2s")
	if code != exitOK || !strings.Contains(out, `"depth":null,"messages":5,`) || !strings.Contains(out, `"dead_letters":5,`) {
		t.Fatalf("stats -json: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, out, errOut = ackwiseRun(t, "dlq", "inspect", dead, "-n", "3", "-idle", "2s")
	if code != exitOK || len(lines(out)) != 3 || !strings.Contains(out, " reason=permanent class=permanent attempts=1 source=projects/"+psProject+"/subscriptions/work ") {
		t.Fatalf("inspect: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if held := pubsubHeld(srv, "dead"); held != n {
		t.Fatalf("inspect and stats consumed: %d of %d dead letters left", held, n)
	}
	missing := strings.Replace(dead, "/subscriptions/dead?", "/subscriptions/missing?", 1)
	code, out, errOut = ackwiseRun(t, "dlq", "stats", missing, "-idle", "500ms")
	if code != exitFailed || out != "" || !strings.Contains(errOut, "NotFound") {
		t.Fatalf("stats of a missing subscription: exit %d, want %d\nstdout %s\nstderr %s", code, exitFailed, out, errOut)
	}

	// A dead letter released by the runs above may have been in transit to
	// a closing client, and comes back after its ack deadline (10 s): run the
	// redrive again until every one moved, as an operator would.
	for moved := 0; moved < n; {
		code, out, errOut = ackwiseRun(t, "dlq", "redrive", dead, target, "-rate", "-1", "-idle", "2s", "--yes")
		var k int
		if _, err := fmt.Sscanf(out, "moved %d ", &k); err != nil || code != exitOK || !strings.Contains(out, "failed 0;") || ctx.Err() != nil {
			t.Fatalf("redrive after %d moved: exit %d\nstdout %s\nstderr %s", moved, code, out, errOut)
		}
		moved += k
	}
	if held := pubsubHeld(srv, "dead"); held != 0 {
		t.Fatalf("the dead-letter subscription holds %d messages after the redrive, want 0", held)
	}
	// The work subscription holds each event once, as published, on its
	// key, without envelope, its redrive counted.
	back, err := adapters.OpenSource(ctx, work)
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	receiveRedriven(t, ctx, back, "e", n, func(m *ackwise.Message) bool { return m.Headers.Get(dlq.HeaderRedriveCount) == "1" })
}

// receiveRedriven receives from src the n events <prefix>0 … <prefix><n-1> that a
// redrive moved back, and acks each: every one once, its payload
// payload-<i> whole, on key k, with its x-tenant header, without envelope,
// and passing check.
func receiveRedriven(t *testing.T, ctx context.Context, src adapters.Source, prefix string, n int, check func(*ackwise.Message) bool) {
	t.Helper()
	seen := map[string]bool{}
	buf := make([]*ackwise.Message, 10)
	for len(seen) < n {
		k, err := src.Receive(ctx, buf)
		if err != nil {
			t.Fatalf("after %d of the redriven events: %v", len(seen), err)
		}
		for _, m := range buf[:k] {
			var i int
			if _, err := fmt.Sscanf(m.ID, prefix+"%d", &i); err != nil || seen[m.ID] || string(m.Payload) != fmt.Sprint("payload-", i) || m.Key != "k" || m.Headers.Get("x-tenant") != "acme" || !check(m) {
				t.Fatalf("redriven %q: payload %q key %q headers %v (seen before: %v)", m.ID, m.Payload, m.Key, m.Headers, seen[m.ID])
			}
			if _, err := dlq.Decode(m.Headers); err == nil {
				t.Fatalf("redriven %s kept its envelope", m.ID)
			}
			seen[m.ID] = true
			if err := src.Ack(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
}
