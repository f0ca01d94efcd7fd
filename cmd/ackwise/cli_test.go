package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/kafka"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/dlq"
)

// TestLs: a table with a header row and a row per message, or one JSON
// object a line with the message's headers, credentials hidden; nothing
// is consumed.
func TestLs(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.add(t, "e1", dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	env := dlq.Envelope{Reason: dlq.ReasonMaxAttempts, ErrorClass: "transient", Source: tb.work, Partition: -1, Offset: -1, Attempts: 5, LastFailure: lastFailure}
	memorytest.Publish(t, tb.b, tb.dead, &ackwise.Message{ID: "e2", Payload: []byte("0123456789"),
		Headers: append(env.Apply(ackwise.HeadersOf("x-tenant", "acme")), ackwise.Header{Key: "Authorization", Value: "Bearer s3cret"})})

	code, out, errOut := ackwiseRun(t, "dlq", "ls", "mem://"+tb.dead, "--idle", "100ms")
	got := lines(out)
	if code != exitOK || len(got) != 3 {
		t.Fatalf("exit %d, stderr %q, output:\n%s", code, errOut, out)
	}
	for i, want := range [][]string{
		{"EVENT ID", "REASON", "CLASS", "SOURCE", "ATTEMPTS", "LAST FAILURE", "SIZE"},
		{"e1", "permanent", "permanent", tb.work, "3", "2026-11-29T10:30:00Z", "10"},
		{"e2", "max-attempts", "transient", tb.work, "5", "2026-11-29T10:30:00Z", "10"},
	} {
		if cols := strings.Join(strings.Fields(got[i]), " "); cols != strings.Join(want, " ") {
			t.Errorf("row %d: %q, want the columns %q", i, got[i], want)
		}
	}
	code, out, _ = ackwiseRun(t, "dlq", "ls", "mem://"+tb.dead, "--idle", "100ms", "--json")
	got = lines(out)
	if code != exitOK || len(got) != 2 {
		t.Fatalf("--json: exit %d, output:\n%s", code, out)
	}
	var l letterOut
	if err := json.Unmarshal([]byte(got[1]), &l); err != nil {
		t.Fatal(err)
	}
	h := map[string]string{}
	for _, kv := range l.Headers {
		h[kv.Key] = kv.Value
	}
	if l.EventID != "e2" || l.Reason != "max-attempts" || h["x-tenant"] != "acme" || h[dlq.HeaderReason] != "max-attempts" || h["Authorization"] == "" {
		t.Fatalf("decoded %+v", l)
	}
	if strings.Contains(out, "s3cret") || l.Payload != nil {
		t.Fatalf("ls --json printed a credential or the payload:\n%s", out)
	}
	tb.requireUntouched(t, 2)
}

// TestShow: one dead letter by event ID, its envelope and headers; the
// payload only with --payload, as text or, when binary, as a hex dump; a
// dead letter that is not there is an error.
func TestShow(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.add(t, "e1", dlq.ReasonPermanent, ackwise.ClassPermanent, "bad \"input\"")
	env := dlq.Envelope{Reason: dlq.ReasonPermanent, ErrorClass: "permanent", Source: tb.work, Partition: -1, Offset: -1, Attempts: 1, LastFailure: lastFailure}
	memorytest.Publish(t, tb.b, tb.dead, &ackwise.Message{ID: "bin", Payload: []byte{0x00, 0xff, 0x1b, '[', '2', 'J'}, Headers: env.Apply(nil)})

	code, out, errOut := ackwiseRun(t, "dlq", "show", "mem://"+tb.dead, "e1", "--idle", "100ms")
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{"event ID:      e1\n", "  reason:", "permanent\n", `"bad \"input\""`, "  consumer:", "billing\n",
		"headers:\n", "  x-tenant: acme\n", "  ackwise-dlq-attempts: 3\n", "payload:       10 bytes (--payload prints it)\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "payload-e1") || strings.Contains(out, "event ID:      bin") {
		t.Errorf("show printed the payload, or another dead letter:\n%s", out)
	}
	code, out, _ = ackwiseRun(t, "dlq", "show", "mem://"+tb.dead, "e1", "--idle", "100ms", "--payload")
	if code != exitOK || !strings.Contains(out, "payload:       10 bytes, text:\npayload-e1\n") {
		t.Errorf("--payload: exit %d:\n%s", code, out)
	}
	// Binary, and an escape sequence that must not reach the terminal.
	code, out, _ = ackwiseRun(t, "dlq", "show", "mem://"+tb.dead, "bin", "--idle", "100ms", "--payload")
	if code != exitOK || !strings.Contains(out, "6 bytes, binary, hex dump:\n00000000  00 ff 1b 5b 32 4a") || strings.Contains(out, "\x1b") {
		t.Errorf("binary --payload: exit %d:\n%q", code, out)
	}
	code, out, errOut = ackwiseRun(t, "dlq", "show", "mem://"+tb.dead, "nope", "--idle", "100ms")
	if code != exitFailed || out != "" || !strings.Contains(errOut, "no dead letter with event ID, offset or message ID nope among the 2 received") {
		t.Errorf("show of a missing event: exit %d, want %d\nstdout %q\nstderr %q", code, exitFailed, out, errOut)
	}
	tb.requireUntouched(t, 2)
}

// TestRedriveSample: --sample K moves K and says it was a sample.
func TestRedriveSample(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	for i := range 5 {
		tb.add(t, fmt.Sprint("e", i), dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	}
	code, out, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", "mem://"+tb.dead, "mem://"+tb.work, "--sample", "2", "--rate", "-1", "--idle", "100ms")
	if code != exitOK || !strings.HasPrefix(out, "moved 2 ") || !strings.Contains(out, "stopped: sample (2 moved: watch their consumer") {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if msgs, _ := tb.b.Messages(tb.work); len(msgs) != 2 {
		t.Fatalf("the work queue holds %d messages, want 2", len(msgs))
	}
	if msgs, _ := tb.b.Messages(tb.dead); len(msgs) != 3 {
		t.Fatalf("the dead-letter queue holds %d messages, want 3", len(msgs))
	}
}

// TestRedriveMaxAge: dead letters written longer ago than --max-age are
// left where they are, each reported, and counted in the summary.
func TestRedriveMaxAge(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.add(t, "old", dlq.ReasonPermanent, ackwise.ClassPermanent, "bad") // written at lastFailure
	env := dlq.Envelope{Reason: dlq.ReasonPermanent, ErrorClass: "permanent", Source: tb.work, Partition: -1, Offset: -1, Attempts: 1, LastFailure: time.Now()}
	memorytest.Publish(t, tb.b, tb.dead, &ackwise.Message{ID: "new", Payload: []byte("p"), Headers: env.Apply(nil)})
	maxAge := time.Since(lastFailure) / 2
	code, out, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", "mem://"+tb.dead, "mem://"+tb.work, "--max-age", maxAge.String(), "--rate", "-1", "--idle", "100ms")
	got := lines(out)
	if code != exitOK || len(got) != 2 || !strings.HasPrefix(got[0], "too-old old reason=permanent") ||
		!strings.HasPrefix(got[1], "moved 1 ") || !strings.Contains(got[1], "; left 1 written more than --max-age ") {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	left, _ := tb.b.Messages(tb.dead)
	if len(left) != 1 || left[0].ID != "old" {
		t.Fatalf("the dead-letter queue holds %v, want the old one", left)
	}
}

// TestRedriveValidatesFilters: a reason or error class that no dead letter
// can carry is a usage error, not a filter that silently matches nothing.
func TestRedriveValidatesFilters(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.add(t, "e1", dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	for _, args := range [][]string{
		{"--reason", "permanent,max-attempt"},
		{"--class", "Transient"},
		{"--sample", "2", "--max", "3"},
		{"--sample", "-1"},
		{"--max-age", "-1h"},
	} {
		code, out, errOut := ackwiseRun(t, append([]string{"dlq", "redrive", "--yes", "mem://" + tb.dead, "mem://" + tb.work, "--idle", "100ms"}, args...)...)
		if code != exitUsage || out != "" {
			t.Errorf("%q: exit %d, want %d\nstdout %q\nstderr %q", args, code, exitUsage, out, errOut)
		}
	}
	_, _, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", "mem://"+tb.dead, "mem://"+tb.work, "--reason", "max-attempt")
	if !strings.Contains(errOut, `--reason max-attempt: unknown reason (known: permanent, max-attempts, expired, unroutable)`) {
		t.Errorf("stderr %q does not name the bad reason and the known ones", errOut)
	}
	tb.requireUntouched(t, 1)
}

// TestRedriveConfirmation: without --yes a redrive asks on a terminal and
// moves nothing unless the answer is yes; without a terminal it refuses.
func TestRedriveConfirmation(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.add(t, "e1", dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	args := []string{"dlq", "redrive", "mem://" + tb.dead, "mem://" + tb.work, "--idle", "100ms", "--rate", "-1"}

	code, out, errOut := ackwiseRun(t, args...)
	if code != exitUsage || out != "" || !strings.Contains(errOut, "give --yes to confirm (stdin is not a terminal") {
		t.Fatalf("no terminal, no --yes: exit %d\nstdout %q\nstderr %q", code, out, errOut)
	}
	tb.requireUntouched(t, 1)
	// A dry run needs no confirmation.
	if code, out, errOut := ackwiseRun(t, append(args, "--dry-run")...); code != exitOK {
		t.Fatalf("dry run: exit %d\nstdout %q\nstderr %q", code, out, errOut)
	}

	ask := func(answer string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		e := testEnv(&stdout, &stderr)
		e.stdin, e.stdinTerminal = strings.NewReader(answer), true
		return runContext(context.Background(), args, e), stdout.String(), stderr.String()
	}
	for _, answer := range []string{"n\n", "\n", "", "yes please\n"} {
		code, out, errOut := ask(answer)
		if code != exitFailed || out != "" || !strings.Contains(errOut, "Move every dead letter from mem://"+tb.dead+" (it holds 1) to mem://"+tb.work+", no rate cap? [y/N] ") ||
			!strings.Contains(errOut, "not confirmed") {
			t.Errorf("answer %q: exit %d\nstdout %q\nstderr %q", answer, code, out, errOut)
		}
	}
	tb.requireUntouched(t, 1)
	if code, out, errOut := ask("Y\n"); code != exitOK || !strings.HasPrefix(out, "moved 1 ") {
		t.Fatalf("answer yes: exit %d\nstdout %q\nstderr %q", code, out, errOut)
	}
	memorytest.RequireEmpty(t, tb.b, tb.dead)
}

// TestRedriveProgressLines: without a terminal, a redrive prints a plain
// progress line to stderr every --progress-every, with the count of the
// backlog, the rate and the time left.
func TestRedriveProgressLines(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	for i := range 20 {
		tb.add(t, fmt.Sprint("e", i), dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	}
	// 20 at 40/s take at least 475ms: some nine lines 50ms apart.
	code, out, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", "mem://"+tb.dead, "mem://"+tb.work, "--rate", "40", "--progress-every", "50ms", "--idle", "100ms")
	if code != exitOK || !strings.HasPrefix(out, "moved 20 ") {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	progress := lines(errOut)
	if len(progress) < 2 {
		t.Fatalf("%d progress lines, want periodic ones:\n%s", len(progress), errOut)
	}
	for _, l := range progress {
		if !strings.HasPrefix(l, "progress: moved ") || !strings.Contains(l, " of 20, ") || !strings.Contains(l, " msg/s, elapsed ") || !strings.Contains(l, ", eta ") {
			t.Fatalf("progress line %q", l)
		}
	}
	// --progress-every 0: none.
	tb.add(t, "x", dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	if code, _, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", "mem://"+tb.dead, "mem://"+tb.work, "--rate", "-1", "--progress-every", "0", "--idle", "100ms"); code != exitOK || errOut != "" {
		t.Fatalf("--progress-every 0: exit %d, stderr %q", code, errOut)
	}
}

// TestRedriveProgressBar: on a terminal the progress goes to a bar with
// the count, the rate and the time left.
func TestRedriveProgressBar(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	for i := range 5 {
		tb.add(t, fmt.Sprint("e", i), dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	}
	var stdout, stderr bytes.Buffer
	e := testEnv(&stdout, &stderr)
	e.stderrTerminal = true
	code := runContext(context.Background(), []string{"dlq", "redrive", "--yes", "mem://" + tb.dead, "mem://" + tb.work, "--rate", "50", "--idle", "100ms"}, e)
	if code != exitOK || !strings.HasPrefix(stdout.String(), "moved 5 ") {
		t.Fatalf("exit %d\nstdout %s\nstderr %q", code, stdout.String(), stderr.String())
	}
	if s := stderr.String(); !strings.Contains(s, "redrive: moved ") || !strings.Contains(s, "100% |") || !strings.Contains(s, "(5/5, ") || !strings.Contains(s, " msg/s)") {
		t.Fatalf("no progress bar on stderr: %q", s)
	}
}

// TestMemRefused: outside the tests' process a mem:// URL names an empty
// broker that lives as long as the command: refused, with the reason.
func TestMemRefused(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"dlq", "stats", "mem://orders.dlq"},
		{"dlq", "redrive", "--yes", "kafka://b/orders.dlq?group=g", "mem://orders"},
		{"lag", "mem://orders"},
	} {
		var stdout, stderr bytes.Buffer
		e := testEnv(&stdout, &stderr)
		e.allowMem = false
		code := runContext(context.Background(), args, e)
		if code != exitUsage || !strings.Contains(stderr.String(), "mem:// is the in-process memory broker of this one command run") {
			t.Errorf("%q: exit %d, stderr %q", args, code, stderr.String())
		}
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	code, out, errOut := ackwiseRun(t, "version")
	if code != exitOK || !strings.HasPrefix(out, "ackwise ") || !strings.Contains(out, "go1.") || errOut != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, _, _ := ackwiseRun(t, "version", "extra"); code != exitUsage {
		t.Fatalf("version extra: exit %d, want %d", code, exitUsage)
	}
}

// TestSingleDashLongFlags: the flag package's syntax of the command before
// cobra (-idle 100ms, -json, -rate -1) still works; a value that looks
// like a flag stays a value.
func TestSingleDashLongFlags(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.add(t, "e1", dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	code, out, errOut := ackwiseRun(t, "dlq", "inspect", "-json", "-idle", "100ms", "mem://"+tb.dead)
	if code != exitOK || !strings.HasPrefix(out, `{"event_id":"e1"`) {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, out, errOut = ackwiseRun(t, "dlq", "redrive", "-yes", "mem://"+tb.dead, "mem://"+tb.work, "-rate", "-1", "-idle=100ms", "-reason", "permanent")
	if code != exitOK || !strings.HasPrefix(out, "moved 1 ") {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if got := legacyFlags(newRoot(env{}), []string{"dlq", "redrive", "-reason", "-json", "a", "b", "--", "-rate"}); strings.Join(got, " ") != "dlq redrive --reason -json a b -- -rate" {
		t.Fatalf("legacyFlags = %q", got)
	}
}

// TestTargetURLDropsSourceParams: a consumer's own source URL is taken as
// the redrive target without the parameters only a source takes, with a
// note naming them.
func TestTargetURLDropsSourceParams(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want, note string }{
		{"kafka://b:9092/orders?group=app&client_id=x&tiers=1m,10m", "kafka://b:9092/orders?client_id=x", "group, tiers"},
		{"amqp://u:p@h/orders?prefetch=64&declare=true&tiers=1s&vhost=v", "amqp://u:p@h/orders?vhost=v", "prefetch, declare, tiers"},
		{"awssqs://sqs.us-east-2.amazonaws.com/1/orders?region=us-east-2&dlq=orders-dlq&wait=1s", "awssqs://sqs.us-east-2.amazonaws.com/1/orders?region=us-east-2", "dlq, wait"},
		{"kafka://b:9092/orders", "kafka://b:9092/orders", ""},
	} {
		var stderr bytes.Buffer
		got := targetURL(&stderr, c.in)
		if got != c.want {
			t.Errorf("targetURL(%s) = %s, want %s", c.in, got, c.want)
		}
		if c.note == "" && stderr.Len() > 0 || c.note != "" && !strings.Contains(stderr.String(), "dropped its source parameters "+c.note+"\n") {
			t.Errorf("targetURL(%s): note %q, want one naming %q", c.in, stderr.String(), c.note)
		}
	}
}

// TestLagQueue: on a queue, lag prints the depth, its change over the
// window (the net drain rate) and the time to drain: never, when the depth
// does not shrink.
func TestLagQueue(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	for i := range 7 {
		tb.add(t, fmt.Sprint("e", i), dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	}
	code, out, errOut := ackwiseRun(t, "lag", "mem://"+tb.dead, "--window", "50ms")
	if code != exitOK || !strings.Contains(out, "depth: 7 messages (was 7), the broker's count\n") ||
		!strings.Contains(out, "net drain: 0.0 msg/s") || !strings.Contains(out, "time to drain: never (") {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, out, _ = ackwiseRun(t, "lag", "mem://"+tb.dead, "--window", "50ms", "--json")
	var r lagReport
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != exitOK || r.Log || r.Backlog != 7 || r.DrainSeconds != nil {
		t.Fatalf("exit %d, %v, %+v", code, err, r)
	}
	tb.requireUntouched(t, 7)
	if code, _, _ := ackwiseRun(t, "lag", "mem://"+tb.dead, "--window", "0s"); code != exitUsage {
		t.Fatalf("--window 0s: exit %d, want %d", code, exitUsage)
	}
}

// TestLagOf: the time to drain is backlog ÷ (consume − ingress), never
// when the consumers do not keep up.
func TestLagOf(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	log := func(at time.Time, end, done int64) lagSample {
		return lagSample{at: at, end: end, done: done, backlog: end - done, partitions: []kafka.PartitionOffsets{{Topic: "t", End: end, Committed: done}}}
	}
	r := lagOf(log(t0, 1000, 400), log(t0.Add(10*time.Second), 1100, 700)) // in 10/s, out 30/s, backlog 400
	if !r.Log || *r.IngressRate != 10 || *r.ConsumeRate != 30 || r.DrainRate != 20 || r.DrainSeconds == nil || *r.DrainSeconds != 20 || r.Backlog != 400 {
		t.Fatalf("%+v", r)
	}
	r = lagOf(log(t0, 1000, 400), log(t0.Add(10*time.Second), 1300, 600)) // in 30/s, out 20/s
	if r.DrainSeconds != nil || r.DrainRate != -10 {
		t.Fatalf("consumers behind: %+v", r)
	}
	q := func(at time.Time, n int64) lagSample { return lagSample{at: at, backlog: n} }
	r = lagOf(q(t0, 300), q(t0.Add(10*time.Second), 250)) // net drain 5/s
	if r.Log || r.IngressRate != nil || r.DrainRate != 5 || *r.DrainSeconds != 50 {
		t.Fatalf("queue: %+v", r)
	}
	r = lagOf(q(t0, 0), q(t0.Add(10*time.Second), 0))
	if r.DrainSeconds == nil || *r.DrainSeconds != 0 {
		t.Fatalf("empty queue: %+v", r)
	}
}

// TestShowSelects: show finds a dead letter by event ID, broker message ID,
// or on a log by offset, alone or with its partition.
func TestShowSelects(t *testing.T) {
	t.Parallel()
	onLog := &ackwise.Message{ID: "e1", BrokerID: "orders.dlq/2@17", Partition: 2, Offset: 17}
	onQueue := &ackwise.Message{ID: "e2", BrokerID: "m-9", Partition: -1, Offset: -1}
	for _, c := range []struct {
		m    *ackwise.Message
		sel  string
		want bool
	}{
		{onLog, "e1", true}, {onLog, "orders.dlq/2@17", true}, {onLog, "17", true}, {onLog, "2:17", true},
		{onLog, "1:17", false}, {onLog, "18", false}, {onLog, "x:17", false}, {onLog, "e2", false},
		{onQueue, "e2", true}, {onQueue, "m-9", true}, {onQueue, "-1", false}, {onQueue, "0", false},
	} {
		if got := selects(c.m, c.sel); got != c.want {
			t.Errorf("selects(%s, %q) = %v, want %v", c.m.BrokerID, c.sel, got, c.want)
		}
	}
}
