package memory_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
)

func TestURLQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := memorytest.UniqueName(t)
	sink, err := adapters.OpenSink(ctx, "mem://"+name+"?lease=5s&max_receives=3&fifo=true&dlq="+name+"-dead")
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	src, err := adapters.OpenSource(ctx, "mem://"+name)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	caps := src.Capabilities()
	if caps.Lease != 5*time.Second || !caps.Ordered || caps.Log {
		t.Fatalf("caps %+v", caps)
	}
	if err := sink.Publish(ctx, msg("a", "k")); err != nil {
		t.Fatal(err)
	}
	if m := recvOne(t, src); m.ID != "a" {
		t.Fatalf("got %q", m.ID)
	}
	// Same parameters again: fine; other ones: a conflict.
	if s, err := adapters.OpenSource(ctx, "mem:"+name); err != nil {
		t.Fatalf("opaque form: %v", err)
	} else {
		s.Close()
	}
	if s, err := adapters.OpenSource(ctx, "mem:///"+name+"?lease=5s&max_receives=3&fifo=true&dlq="+name+"-dead"); err != nil {
		t.Fatalf("same parameters: %v", err)
	} else {
		s.Close()
	}
	if _, err := adapters.OpenSource(ctx, "mem://"+name+"?lease=6s"); !errors.Is(err, memory.ErrConflict) {
		t.Fatalf("other lease: %v", err)
	}
	memory.Default().Delete(name)
}

func TestURLLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := memorytest.UniqueName(t)
	u := "mem://" + name + "?partitions=3&group=billing"
	sink, err := adapters.OpenSink(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	a, err := adapters.OpenSource(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if !a.Capabilities().Log {
		t.Fatal("not a log source")
	}
	if err := sink.Publish(ctx, &ackwise.Message{ID: "x", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	m := recvOne(t, a)
	if m.Partition != memory.PartitionOf("k", 3) {
		t.Fatalf("partition %d", m.Partition)
	}
	if err := a.Ack(ctx, m); err != nil {
		t.Fatal(err)
	}
	memorytest.WaitForCommitted(t, memory.Default(), name, "billing", m.Partition, 1)
	// A plain sink URL publishes into the existing topic.
	plain, err := adapters.OpenSink(ctx, "mem://"+name)
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Publish(ctx, &ackwise.Message{ID: "y", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if m := recvOne(t, a); m.ID != "y" {
		t.Fatalf("got %q", m.ID)
	}
	memory.Default().Delete(name)
}

func TestURLErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct{ url, want string }{
		{"mem://", "names no queue"},
		{"mem://q?lease=abc", `"lease" = "abc": want a positive Go duration`},
		{"mem://q?lease=-1s", `"lease" = "-1s"`},
		{"mem://q?max_receives=-2", `"max_receives" = "-2": want a non-negative integer`},
		{"mem://q?max_receives=x", `"max_receives" = "x"`},
		{"mem://q?fifo=maybe", `"fifo" = "maybe": want true or false`},
		{"mem://q?partitions=0", `"partitions" = "0": want an integer in [1, 65536]`},
		{"mem://q?partitions=two", `"partitions" = "two"`},
		{"mem://q?retention=-1", `"retention" = "-1"`},
		{"mem://q?group=", `"group" is empty`},
		{"mem://q?dlq=", `"dlq" is empty`},
		{"mem://q?colour=blue", `"colour" is unknown (known: lease, max_receives, dlq, fifo, partitions, retention, group)`},
		{"mem://q?lease=1s&lease=2s", `"lease" is given more than once`},
		{"mem://q?partitions=2&lease=1s", `"lease" = "1s": is a queue parameter`},
		{"mem://q?partitions=2", "memory: URL has no group= parameter; a log source needs one"},
		{"mem://q?%zz", "memory: URL query is malformed"},
	} {
		_, err := adapters.OpenSource(ctx, c.url)
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, adapters.ErrBadURL) {
			t.Errorf("OpenSource(%q) = %v, want error containing %q", c.url, err, c.want)
		}
	}
	if _, err := adapters.OpenSink(ctx, "mem://q?colour=blue"); err == nil || !strings.Contains(err.Error(), "colour") {
		t.Errorf("OpenSink with unknown parameter = %v", err)
	}
}

// TestURLErrorsHidePassword: a password with an unescaped '/', '?' or '#'
// ends the user info early, and url.Parse puts the rest in the path, query
// or fragment (and its start in the host). Before, the memory opener named
// that part: "mem://u:12345?S3CRET@q" failed with "unknown URL parameter
// S3CRET@q", and "mem://u:12345/S3CRET@q" opened a queue named after the
// password. Now every such URL is refused, as the Kafka and RabbitMQ
// openers refuse it, without showing any of it; a well-formed URL with a
// password shows it redacted.
func TestURLErrorsHidePassword(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	secrets := []string{"12345", "S3CRET"}
	for _, raw := range []string{
		"mem://u:12345?S3CRET@q",
		"mem://u:12345?S3CRET@q?lease=1s",
		"mem://u:12345/S3CRET@q",
		"mem://u:12345#S3CRET@q",
		"mem://u:12345/S3CRET@q?colour=blue",
		"mem://u:12345@S3CRET?x@q",
		"mem:u:12345S3CRET@q",
		"mem:///u:12345S3CRET@q",
	} {
		for _, open := range []struct {
			side string
			f    func() error
		}{
			{"source", func() error { _, err := adapters.OpenSource(ctx, raw); return err }},
			{"sink", func() error { _, err := adapters.OpenSink(ctx, raw); return err }},
		} {
			err := open.f()
			if !errors.Is(err, adapters.ErrMisplacedUserInfo) {
				t.Errorf("Open%s(%q) = %v, want ErrMisplacedUserInfo", open.side, raw, err)
				continue
			}
			for _, s := range secrets {
				if strings.Contains(err.Error(), s) {
					t.Errorf("Open%s(%q): error %q shows %q of the password", open.side, raw, err, s)
				}
			}
		}
	}
	// Well-formed user info: errors show the URL with the password hidden.
	for _, raw := range []string{"mem://u:S3CRET@q?colour=blue", "mem://u:S3CRET@/?lease=1s", "mem://u:S3CRET@q?partitions=2"} {
		_, err := adapters.OpenSource(ctx, raw)
		if err == nil || strings.Contains(err.Error(), "S3CRET") {
			t.Errorf("OpenSource(%q) = %v, want an error without the password", raw, err)
		}
	}
}

// Not parallel: it swaps the package-level broker (parallel tests wait
// until it is done).
func TestSetDefault(t *testing.T) {
	prev := memory.Default()
	defer memory.SetDefault(prev)
	clk := memory.NewVirtualClock(time.Time{})
	b, err := memory.New(memory.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	memory.SetDefault(b)
	src, err := adapters.OpenSource(context.Background(), "mem://set-default?lease=1m")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	memorytest.Publish(t, b, "set-default", msg("a", ""))
	m := recvOne(t, src)
	clk.Advance(time.Minute) // the URL's source runs on b's virtual clock
	if src.Valid(m) {
		t.Fatal("lease did not run out on the virtual clock")
	}
	memory.SetDefault(nil)
	if memory.Default() == b || memory.Default() == nil {
		t.Fatal("SetDefault(nil) did not go back to a fresh broker")
	}
}

// A URL naming some parameters of an existing destination is checked on
// those only: the ones it leaves out are the destination's, not defaults.
func TestURLChecksOnlyTheParametersGiven(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := memory.Default()
	topic, queue := memorytest.UniqueName(t)+"-t", memorytest.UniqueName(t)+"-q"
	if err := b.CreateTopic(topic, memory.TopicConfig{Partitions: 4, Retention: 1000, DeadLetter: topic + ".dlq"}); err != nil {
		t.Fatal(err)
	}
	if err := b.CreateQueue(queue, memory.QueueConfig{Lease: 5 * time.Second, MaxReceives: 3, DeadLetter: queue + ".dead"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Delete(topic); b.Delete(queue) })
	for _, ok := range []string{
		"mem://" + topic + "?group=g&dlq=" + topic + ".dlq",
		"mem://" + topic + "?group=g&partitions=4",
		"mem://" + queue + "?dlq=" + queue + ".dead",
		"mem://" + queue + "?lease=5s",
	} {
		src, err := adapters.OpenSource(ctx, ok)
		if err != nil {
			t.Errorf("%s: %v", ok, err)
			continue
		}
		src.Close()
	}
	for _, conflict := range []string{
		"mem://" + topic + "?group=g&dlq=other",
		"mem://" + topic + "?group=g&partitions=2",
		"mem://" + queue + "?dlq=other",
		"mem://" + queue + "?max_receives=4",
	} {
		if _, err := adapters.OpenSource(ctx, conflict); !errors.Is(err, memory.ErrConflict) {
			t.Errorf("%s: %v, want ErrConflict", conflict, err)
		}
	}
}
