package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/dlq"
)

var seq atomic.Int64

type testBundle struct {
	b    *memory.Broker
	dead string // a dead-letter queue on memory.Default(), which mem:// URLs open
	work string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	n := seq.Add(1)
	tb := &testBundle{b: memory.Default(), work: fmt.Sprintf("cli-work-%d", n), dead: fmt.Sprintf("cli-work-%d.dlq", n)}
	for _, q := range []string{tb.work, tb.dead} {
		if err := tb.b.CreateQueue(q, memory.QueueConfig{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tb.b.Delete(q) })
	}
	return tb
}

var lastFailure = time.Date(2026, 11, 29, 10, 30, 0, 0, time.UTC)

// add publishes a dead letter with the given envelope fields into the
// dead-letter queue.
func (tb *testBundle) add(t *testing.T, id string, reason dlq.Reason, class ackwise.Class, errText string) {
	t.Helper()
	env := dlq.Envelope{
		Reason: reason, Error: errText, ErrorClass: class.String(), Source: tb.work,
		Partition: -1, Offset: -1, MessageID: "m-" + id, Attempts: 3,
		FirstFailure: lastFailure.Add(-time.Minute), LastFailure: lastFailure, Consumer: "billing",
	}
	msg := &ackwise.Message{ID: id, Key: "k", Payload: []byte("payload-" + id), Headers: env.Apply(ackwise.HeadersOf("x-tenant", "acme"))}
	memorytest.Publish(t, tb.b, tb.dead, msg)
}

func (tb *testBundle) requireUntouched(t *testing.T, n int) {
	t.Helper()
	st, err := tb.b.Stats(tb.dead)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != n || st.InFlight != 0 || st.Acked != 0 {
		t.Fatalf("dead-letter queue: %d ready, %d in flight, %d acked; want %d, 0, 0", st.Ready, st.InFlight, st.Acked, n)
	}
}

func ackwiseRun(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = runContext(context.Background(), args, testEnv(&out, &errOut))
	return code, out.String(), errOut.String()
}

// testEnv is the env of a run inside the test: no terminal, an empty
// stdin, and mem:// URLs naming the test's own memory broker.
func testEnv(stdout, stderr io.Writer) env {
	return env{stdin: strings.NewReader(""), stdout: stdout, stderr: stderr, allowMem: true}
}

func lines(s string) []string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func TestInspectPrintsAndReleases(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.add(t, "e1", dlq.ReasonPermanent, ackwise.ClassPermanent, "bad \"input\"\nline two")
	long := strings.Repeat("é", 300)
	tb.add(t, "e2", dlq.ReasonMaxAttempts, ackwise.ClassTransient, long)
	memorytest.Publish(t, tb.b, tb.dead, memorytest.Msg("plain", "", "x"))

	code, out, errOut := ackwiseRun(t, "dlq", "inspect", "mem://"+tb.dead, "-n", "10", "--idle", "100ms")
	if code != exitOK || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	got := lines(out)
	if len(got) != 3 {
		t.Fatalf("%d lines:\n%s", len(got), out)
	}
	want1 := fmt.Sprintf(`e1 reason=permanent class=permanent attempts=3 source=%s last-failure=2026-11-29T10:30:00Z error="bad \"input\"\nline two"`, tb.work)
	if got[0] != want1 {
		t.Fatalf("line 1\n got %s\nwant %s", got[0], want1)
	}
	want2 := fmt.Sprintf(`e2 reason=max-attempts class=transient attempts=3 source=%s last-failure=2026-11-29T10:30:00Z error="%s…"`, tb.work, strings.Repeat("é", maxErrorLen))
	if got[1] != want2 {
		t.Fatalf("line 2 (error cut to %d runes)\n got %s\nwant %s", maxErrorLen, got[1], want2)
	}
	if !strings.HasPrefix(got[2], "plain no-envelope broker-id=") {
		t.Fatalf("line 3: %s", got[2])
	}
	if strings.Contains(out, "payload-") {
		t.Fatal("inspect printed a payload")
	}
	tb.requireUntouched(t, 3)

	// -n bounds what is received; a second inspection sees the same letters.
	code, out, _ = ackwiseRun(t, "dlq", "inspect", "-n", "1", "--idle", "100ms", "mem://"+tb.dead)
	if code != exitOK || len(lines(out)) != 1 || !strings.HasPrefix(out, "e1 ") {
		t.Fatalf("exit %d, output %q", code, out)
	}
	tb.requireUntouched(t, 3)
}

func TestInspectJSON(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.add(t, "e1", dlq.ReasonPermanent, ackwise.ClassPermanent, "boom")
	code, out, errOut := ackwiseRun(t, "dlq", "inspect", "mem://"+tb.dead, "--json", "--idle", "100ms")
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var l letterOut
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("%v in %q", err, out)
	}
	if l.EventID != "e1" || !l.DeadLetter || l.Reason != "permanent" || l.Error != "boom" || l.Attempts != 3 ||
		l.MessageID != "m-e1" || l.LastFailure == nil || !l.LastFailure.Equal(lastFailure) || l.PayloadBytes != len("payload-e1") || l.Partition != nil {
		t.Fatalf("decoded %+v", l)
	}
	tb.requireUntouched(t, 1)
}

func TestStats(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	for i := range 3 {
		tb.add(t, fmt.Sprint("p", i), dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	}
	tb.add(t, "m0", dlq.ReasonMaxAttempts, ackwise.ClassTransient, "timeout")
	// p0 dead-lettered twice (a crash between the dead letter's confirm
	// and the ack): one event, two copies.
	tb.add(t, "p0", dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	memorytest.Publish(t, tb.b, tb.dead, memorytest.Msg("plain", "", "x"))

	code, out, errOut := ackwiseRun(t, "dlq", "stats", "mem://"+tb.dead, "--idle", "100ms")
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{
		"depth: 6 (the broker's count)\n",
		"sample: 6 messages (dead letters: 5, without envelope: 1)\n",
		"event IDs: 5 distinct (copies: 1;",
		"by reason:\n  permanent                4\n  max-attempts             1\n",
		"by error class:\n  permanent                4\n  transient                1\n",
		"oldest dead letter: written 2026-11-29T10:30:00Z (age ",
		"stopped: idle",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("stats output lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = ackwiseRun(t, "dlq", "stats", "mem://"+tb.dead, "--idle", "100ms", "--json")
	var s statsOut
	if err := json.Unmarshal([]byte(out), &s); err != nil || code != exitOK {
		t.Fatalf("exit %d, %v in %q", code, err, out)
	}
	if s.Depth == nil || *s.Depth != 6 || s.Messages != 6 || s.SampleCutShort || s.DistinctEventIDs != 5 || s.Copies != 1 ||
		s.ByReason["permanent"] != 4 || s.ByErrorClass["transient"] != 1 || s.BySource[tb.work] != 5 || s.NoEnvelope != 1 || s.OldestAgeSeconds == nil {
		t.Fatalf("stats %+v", s)
	}
	tb.requireUntouched(t, 6)

	// -n smaller than the depth: a sample of -n, not cut short.
	code, out, _ = ackwiseRun(t, "dlq", "stats", "mem://"+tb.dead, "--idle", "100ms", "-n", "2")
	if code != exitOK || !strings.Contains(out, "depth: 6 ") || !strings.Contains(out, "sample: 2 messages (dead letters: 2, without envelope: 0); 2 of 6 (-n 2)\n") {
		t.Fatalf("exit %d, output:\n%s", code, out)
	}
	tb.requireUntouched(t, 6)
}

func TestRedrive(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.add(t, "p0", dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	tb.add(t, "p1", dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	tb.add(t, "m0", dlq.ReasonMaxAttempts, ackwise.ClassTransient, "timeout")
	from, to := "mem://"+tb.dead, "mem://"+tb.work

	// A dry run prints what would move and moves nothing.
	code, out, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", from, to, "--dry-run", "--reason", "permanent", "--idle", "100ms")
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	got := lines(out)
	if len(got) != 4 || !strings.HasPrefix(got[0], "would-move p0 reason=permanent") || !strings.HasPrefix(got[1], "would-move p1 ") ||
		!strings.HasPrefix(got[2], "skipped m0 reason=max-attempts") ||
		!strings.HasPrefix(got[3], "would move 2 from "+from+" to "+to+"; skipped 1 (0 without envelope); failed 0; stopped: backlog") {
		t.Fatalf("dry run output:\n%s", out)
	}
	tb.requireUntouched(t, 3)
	if msgs, _ := tb.b.Messages(tb.work); len(msgs) != 0 {
		t.Fatalf("dry run published %d messages", len(msgs))
	}

	code, out, errOut = ackwiseRun(t, "dlq", "redrive", "--yes", from, to, "--reason", "permanent", "--rate", "-1", "--idle", "100ms")
	if code != exitOK || !strings.HasPrefix(out, "moved 2 from ") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	msgs, err := tb.b.Messages(tb.work)
	if err != nil || len(msgs) != 2 || msgs[0].ID != "p0" || string(msgs[0].Payload) != "payload-p0" || msgs[0].Headers.Get("x-tenant") != "acme" {
		t.Fatalf("work queue: %v %v", msgs, err)
	}
	for _, kv := range msgs[0].Headers {
		k := kv.Key
		if strings.HasPrefix(k, dlq.HeaderPrefix) {
			t.Fatalf("redriven message kept %s", k)
		}
	}
	left, _ := tb.b.Messages(tb.dead)
	if len(left) != 1 || left[0].ID != "m0" {
		t.Fatalf("dead-letter queue holds %v", left)
	}

	// -max bounds the move; -class filters on the error class.
	code, out, _ = ackwiseRun(t, "dlq", "redrive", "--yes", from, to, "--class", "transient", "--max", "1", "--idle", "100ms")
	if code != exitOK || !strings.HasPrefix(out, "moved 1 ") || !strings.Contains(out, "stopped: max") {
		t.Fatalf("exit %d, output %q", code, out)
	}
	memorytest.RequireEmpty(t, tb.b, tb.dead)
}

func TestRedrivePublishFailureExits1(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.add(t, "e1", dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	if _, err := tb.b.InjectFault(tb.work, memory.Fault{Kind: memory.FaultFailPublish, Count: 1}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", "mem://"+tb.dead, "mem://"+tb.work, "--idle", "100ms")
	if code != exitFailed {
		t.Fatalf("exit %d, want %d", code, exitFailed)
	}
	if !strings.Contains(errOut, "publish failed") || !strings.Contains(out, "moved 0 ") || !strings.Contains(out, "failed 1") {
		t.Fatalf("stdout %q\nstderr %q", out, errOut)
	}
	tb.requireUntouched(t, 1)
}

func TestUsageErrorsExit2(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{},
		{"nope"},
		{"dlq"},
		{"dlq", "nope"},
		{"dlq", "inspect"},
		{"dlq", "inspect", "mem://a", "mem://b"},
		{"dlq", "inspect", "mem://a", "-n", "0"},
		{"dlq", "inspect", "mem://a", "-n", "x"},
		{"dlq", "inspect", "mem://a", "--bogus"},
		{"dlq", "stats", "mem://a", "--idle", "0s"},
		{"dlq", "redrive", "--yes", "mem://a"},
		{"dlq", "redrive", "--yes", "mem://a", "mem://a"},
		{"dlq", "redrive", "--yes", "mem://a", "mem://b", "--rate", "-3"},
		{"dlq", "redrive", "--yes", "mem://a", "mem://b", "--rate", "0"},
		{"dlq", "redrive", "--yes", "mem://a", "mem://b", "--max", "-1"},
		{"dlq", "redrive", "--yes", "mem://a", "mem://b", "--max-held", "0"},
		{"dlq", "redrive", "--yes", "mem://a", "mem://b", "--publish-timeout", "0s"},
		{"dlq", "redrive", "--yes", "mem://a", "mem://b", "--max-redrives", "0"},
		{"dlq", "redrive", "--yes", "mem://a", "mem://b", "--max-redrives", "-1"},
		{"dlq", "redrive", "--yes", "mem://a", "mem://b", "--force=maybe"},
	} {
		code, out, errOut := ackwiseRun(t, args...)
		if code != exitUsage || !strings.Contains(errOut, "usage: ackwise") || out != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 with usage on stderr", args, code, out, errOut)
		}
	}
	// The option's own validation names the field and the value.
	_, _, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", "mem://a", "mem://b", "--rate", "-3")
	if !strings.Contains(errOut, "Rate = -3") {
		t.Errorf("stderr %q does not name the bad rate", errOut)
	}
	for _, args := range [][]string{{"help"}, {"dlq", "-h"}, {"dlq", "redrive", "--yes", "-h"}} {
		code, out, _ := ackwiseRun(t, args...)
		if code != exitOK || !strings.Contains(out, "usage: ackwise") {
			t.Errorf("%q: exit %d, stdout %q", args, code, out)
		}
	}
}

func TestErrorsNeverShowPasswords(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.add(t, "e1", dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"dlq", "inspect", "nosuch://user:secret@h/q"}, exitFailed},
		{[]string{"dlq", "stats", "amqp://user:secret@h:badport/q"}, exitFailed},
		{[]string{"dlq", "redrive", "--yes", "mem://" + tb.dead, "nosuch://user:secret@h/q", "--idle", "100ms"}, exitFailed},
		{[]string{"dlq", "redrive", "--yes", "nosuch://user:secret@h/q", "nosuch://user:secret@h/q"}, exitUsage},
		// A mem:// URL ignores userinfo: the run succeeds, and its summary
		// names the URLs without the password.
		{[]string{"dlq", "redrive", "--yes", "mem://user:secret@" + tb.dead, "mem://user:secret@" + tb.work, "--idle", "100ms", "-v"}, exitOK},
	} {
		code, out, errOut := ackwiseRun(t, tc.args...)
		if code != tc.code {
			t.Errorf("%q: exit %d, want %d (stderr %q)", tc.args, code, tc.code, errOut)
		}
		if strings.Contains(out+errOut, "secret") {
			t.Errorf("%q printed the password:\nstdout %q\nstderr %q", tc.args, out, errOut)
		}
	}
	if msgs, _ := tb.b.Messages(tb.work); len(msgs) != 1 {
		t.Fatalf("work queue holds %d messages after the redrive, want 1", len(msgs))
	}
}

func TestInterruptReleases(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.add(t, "e1", dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	tb.add(t, "e2", dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	tb.add(t, "e3", dlq.ReasonPermanent, ackwise.ClassPermanent, "bad")
	// Another consumer holds e1: the queue's backlog (3) counts it, so the
	// run, having received e2 and e3, waits for more.
	other, err := tb.b.QueueSource(tb.dead)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	held := memorytest.Receive(t, other, 1)[0]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Cancel once the run holds e2 and e3: the dry run is waiting for more.
	go func() {
		_ = tb.b.WaitHistory(ctx, tb.dead, func(evs []memory.Event) bool {
			n := 0
			for _, e := range evs {
				if e.Kind == memory.EventDelivered {
					n++
				}
			}
			return n == 3 // e1 by the other consumer, e2 and e3 by the run
		})
		cancel()
	}()
	var out, errOut bytes.Buffer
	code := runContext(ctx, []string{"dlq", "redrive", "--yes", "mem://" + tb.dead, "mem://" + tb.work, "--dry-run", "--idle", "1m"}, testEnv(&out, &errOut))
	if code != exitFailed || !strings.Contains(errOut.String(), "context canceled") {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
	if err := other.Release(context.Background(), held); err != nil {
		t.Fatal(err)
	}
	tb.requireUntouched(t, 3)
}

// TestRedriveLimitAndForce: dead letters redriven -max-redrives times
// already are left and reported, one line each and in the summary; -force
// moves them.
func TestRedriveLimitAndForce(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	for i, count := range []string{"0", "1", "2", "x"} {
		env := dlq.Envelope{Reason: dlq.ReasonPermanent, ErrorClass: "permanent", Source: tb.work, Partition: -1, Offset: -1, Attempts: 1, Consumer: "billing"}
		h := env.Apply(ackwise.HeadersOf(dlq.HeaderRedriveCount, count))
		memorytest.Publish(t, tb.b, tb.dead, &ackwise.Message{ID: fmt.Sprint("c", i), Payload: []byte("p"), Headers: h})
	}
	from, to := "mem://"+tb.dead, "mem://"+tb.work
	code, out, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", from, to, "--rate", "-1", "--idle", "100ms", "--max-redrives", "2")
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	got := lines(out)
	if len(got) != 3 || !strings.HasPrefix(got[0], "redrive-limit c2 ") || !strings.Contains(got[0], " redrives=2 ") ||
		!strings.HasPrefix(got[1], "redrive-limit c3 ") || !strings.Contains(got[1], " redrives=x ") ||
		!strings.HasPrefix(got[2], "moved 2 from ") || !strings.Contains(got[2], "; left 2 redriven 2 times already (--force moves them);") {
		t.Fatalf("output:\n%s", out)
	}
	code, out, errOut = ackwiseRun(t, "dlq", "redrive", "--yes", from, to, "--rate", "-1", "--idle", "100ms", "--max-redrives", "2", "--force")
	if code != exitOK || !strings.HasPrefix(out, "moved 2 from ") || strings.Contains(out, "; left") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	memorytest.RequireEmpty(t, tb.b, tb.dead)
	msgs, err := tb.b.Messages(tb.work)
	if err != nil || len(msgs) != 4 {
		t.Fatalf("work queue: %d messages, %v", len(msgs), err)
	}
	for _, m := range msgs {
		want := map[string]string{"c0": "1", "c1": "2", "c2": "3", "c3": strconv.Itoa(math.MaxInt)}[m.ID]
		if c := m.Headers.Get(dlq.HeaderRedriveCount); c != want {
			t.Errorf("%s redriven with count %q, want %q", m.ID, c, want)
		}
	}
}
