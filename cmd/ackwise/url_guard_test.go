package main

import (
	"strings"
	"testing"
)

// TestMalformedURLDoesNotPrintPassword: a password holding, unescaped, a
// character that ends the user info ('#', '/', '?') made url.Parse fail
// with an error quoting what followed the colon, or left the rest of the
// password in the path, echoed as the topic: the password was printed.
func TestMalformedURLDoesNotPrintPassword(t *testing.T) {
	for _, u := range []string{
		"kafka://ops:Sup3rSecret#x@broker:9092/orders.dlq?group=g",
		"kafka://ops:Sup3rSecret/x@broker:9092/orders.dlq?group=g",
		"amqp://ops:Sup3rSecret?x@broker:5672/orders.dlq?plain=true",
		"kafka://ops:1234/Sup3rSecret@broker:9092/orders.dlq?group=g",
	} {
		code, out, errOut := ackwiseRun(t, "dlq", "inspect", u, "--idle", "100ms")
		if strings.Contains(out+errOut, "Sup3rSecret") {
			t.Errorf("%s: exit %d, printed the password:\nstdout %q\nstderr %q", u, code, out, errOut)
		}
	}
}

// TestRedriveRefusesSameDestination: the guard against redriving a
// dead-letter queue into itself compared raw strings, so the queue spelt
// differently passed, and the redrive replaced each dead letter with a copy
// without its envelope, which no later redrive moves.
func TestRedriveRefusesSameDestination(t *testing.T) {
	tb := setup(t)
	tb.add(t, "e1", "permanent", 2, "bad")
	code, out, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", "mem://"+tb.dead, "mem://"+tb.dead+"/", "--idle", "100ms")
	if code != exitUsage {
		t.Errorf("redrive into the same queue spelt differently: exit %d, want a usage error:\nstdout %q\nstderr %q", code, out, errOut)
	}
	msgs, _ := tb.b.Messages(tb.dead)
	for _, m := range msgs {
		if m.Headers.Get("ackwise-dlq-reason") == "" {
			t.Errorf("exit %d, stdout %q, stderr %q: the dead letter lost its envelope", code, out, errOut)
		}
	}
}

// TestDryRunOpensTarget: a dry run opened no target, nor parsed its URL:
// a target the real run cannot open was reported as a successful dry run.
func TestDryRunOpensTarget(t *testing.T) {
	tb := setup(t)
	tb.add(t, "e1", "permanent", 2, "bad")
	for _, target := range []string{"nosuch://x/y", "kafka://broker:9092/orders?tier=1m", "kafka://broker:9092/bad topic"} {
		code, out, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", "mem://"+tb.dead, target, "--dry-run", "--idle", "100ms")
		if code == exitOK {
			t.Errorf("%s: dry run exit 0 for a target the real run cannot open:\nstdout %q\nstderr %q", target, out, errOut)
		}
	}
}

// TestEmptyFilterValueIsUsageError: an empty filter value (-reason "" from
// an unset shell variable) was dropped, and the redrive then moved every
// dead letter.
func TestEmptyFilterValueIsUsageError(t *testing.T) {
	tb := setup(t)
	tb.add(t, "e1", "permanent", 2, "bad")
	tb.add(t, "e2", "max-attempts", 1, "bad")
	code, out, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", "mem://"+tb.dead, "mem://"+tb.work, "--reason", "", "--idle", "100ms")
	if code != exitUsage {
		t.Errorf("-reason \"\": exit %d, want a usage error:\nstdout %q\nstderr %q", code, out, errOut)
	}
}

// TestRedriveRefusesSameRabbitQueueSpeltOtherwise: rabbit:// and amqps://
// name the same broker as amqp://, and amqp://host is amqp://host:5672.
func TestRedriveRefusesSameRabbitQueueSpeltOtherwise(t *testing.T) {
	t.Parallel()
	for _, target := range []string{
		"rabbit://guest:guest@127.0.0.1:1/q.dlq",
		"AMQP://guest:guest@127.0.0.1:1/q.dlq",
	} {
		code, out, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", "amqp://guest:guest@127.0.0.1:1/q.dlq?plain=true", target, "--idle", "100ms")
		if code != exitUsage {
			t.Errorf("redrive into %s: exit %d, want a usage error:\nstdout %q\nstderr %q", target, code, out, errOut)
		}
	}
	code, out, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", "amqp://guest:guest@localhost/q.dlq?plain=true", "amqp://guest:guest@localhost:5672/q.dlq", "--idle", "100ms")
	if code != exitUsage {
		t.Errorf("redrive into the default port spelt out: exit %d, want a usage error:\nstdout %q\nstderr %q", code, out, errOut)
	}
}

// TestRedriveRefusesRabbitTargetNamingTheQueueAsRoutingKey: a RabbitMQ sink
// URL may name its queue as the routing key on the default exchange
// (amqp://host/?routing_key=q.dlq) instead of in the path. The refusal
// compared paths only, so such a target naming the dead-letter queue passed,
// and the redrive replaced each dead letter with a copy without its envelope.
func TestRedriveRefusesRabbitTargetNamingTheQueueAsRoutingKey(t *testing.T) {
	t.Parallel()
	for _, target := range []string{
		"amqp://guest:guest@127.0.0.1:1/?routing_key=q.dlq",
		"amqp://guest:guest@127.0.0.1:1?routing_key=q.dlq",
		"amqp://guest:guest@127.0.0.1:1/q?declare=true&routing_key=q.dlq",
	} {
		code, out, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", "amqp://guest:guest@127.0.0.1:1/q.dlq?plain=true", target, "--idle", "100ms")
		if code != exitUsage {
			t.Errorf("redrive into %s: exit %d, want a usage error:\nstdout %q\nstderr %q", target, code, out, errOut)
		}
	}
}

// TestSameDestinationSpellings: what names one destination however it is
// spelt, and what only looks alike. A Kafka broker's default port and the
// order of a broker list do not change the topic; a RabbitMQ vhost does
// change the queue (the refusal left no way to redrive between vhosts).
func TestSameDestinationSpellings(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"kafka://b/orders.dlq", "kafka://b:9092/orders.dlq", true},
		{"kafka://b1:9092,b2:9092/orders.dlq?group=g", "kafka://b2,b1/orders.dlq", true},
		{"kafka://b1/orders.dlq", "kafka://b1:9093/orders.dlq", false},
		{"amqp://h/q.dlq?vhost=a", "amqp://h/q.dlq?vhost=b", false},
		{"amqp://h/q.dlq", "amqp://h/q.dlq?vhost=/", true},
		{"amqp://h/q.dlq?vhost=a", "rabbit://h:5672/q.dlq?vhost=a", true},
		{"awssqs://sqs.us-east-2.amazonaws.com/123/orders-dlq?wait=1s", "awssqs://SQS.us-east-2.amazonaws.com:443/123/orders-dlq", true},
		{"awssqs://sqs.us-east-2.amazonaws.com/123/orders-dlq", "awssqs://sqs.us-east-2.amazonaws.com/123/orders", false},
		{"awssqs://sqs.us-east-2.amazonaws.com/123/orders", "awssqs://sqs.us-east-2.amazonaws.com/456/orders", false},
	} {
		if got := sameDestination(c.a, c.b); got != c.same {
			t.Errorf("sameDestination(%s, %s) = %v, want %v", c.a, c.b, got, c.same)
		}
	}
}
