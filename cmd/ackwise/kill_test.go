package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

// envChildArgs carries, JSON-encoded, the command line of the CLI that
// TestCLIChild runs in a subprocess (the test binary re-executing itself).
const envChildArgs = "ACKWISE_CLI_CHILD_ARGS"

// TestCLIChild is the CLI as a process of its own, for the tests that kill
// it: it runs only in the subprocess startCLI starts, as main would (with
// its signal handling, and refusing mem://), and exits with its status.
func TestCLIChild(t *testing.T) {
	raw := os.Getenv(envChildArgs)
	if raw == "" {
		return // not the subprocess: nothing to do
	}
	var args []string
	if err := json.Unmarshal([]byte(raw), &args); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(exitUsage)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runContext(ctx, args, osEnv())
	stop()
	os.Exit(code)
}

// startCLI starts the CLI with args in a subprocess, killed when t ends,
// and returns it with its stderr, a line at a time.
func startCLI(t *testing.T, args ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	raw, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	// -test.short: the subprocess starts no SQS emulator (TestMain).
	cmd := exec.Command(os.Args[0], "-test.run=^TestCLIChild$", "-test.short", "-test.count=1")
	cmd.Env = append(os.Environ(), envChildArgs+"="+string(raw))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, bufio.NewScanner(stderr)
}

var progressMoved = regexp.MustCompile(`^progress: moved (\d+),`)

// TestRabbitMQRedriveKilledMidway: a redrive killed with SIGKILL in the
// middle of its run, then run again, loses no dead letter: every event is
// in the work queue, none is left in the dead-letter queue, and the only
// events found twice are those the killed run had published (confirmed)
// but whose ack had not reached the broker yet (the at-least-once window
// docs/redrive.md describes), a few at most.
func TestRabbitMQRedriveKilledMidway(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ; -short runs offline tests only")
	}
	t.Parallel()
	conn, queue := freshRabbitQueue(t, "ackwise-cli-kill-")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ch := declareQueues(t, conn, queue, queue+".dlq")
	publishDeadLetters(t, ctx, rabbitURL()+"/"+queue+".dlq", queue, deadLetters)
	deadURL := rabbitURL() + "/" + queue + ".dlq?plain=true&prefetch=1000"
	workURL := rabbitURL() + "/" + queue

	cmd, stderr := startCLI(t, "dlq", "redrive", "--yes", deadURL, workURL, "--rate", "100", "--progress-every", "50ms", "--idle", "5s")
	killedAt := -1
	for killedAt < 0 && stderr.Scan() {
		m := progressMoved.FindStringSubmatch(stderr.Text())
		if m == nil {
			continue
		}
		if n, _ := strconv.Atoi(m[1]); n >= 50 {
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			killedAt = n
		}
	}
	if killedAt < 0 {
		t.Fatalf("the redrive ended before it had moved 50 (stderr: %v)", stderr.Err())
	}
	if err := cmd.Wait(); err == nil || cmd.ProcessState.ExitCode() != -1 {
		t.Fatalf("the redrive was not killed: %v", err)
	}
	if killedAt >= deadLetters {
		t.Fatalf("killed after %d moves: not midway", killedAt)
	}
	// The broker requeues what the killed run held once it sees the
	// connection gone.
	deadline := time.Now().Add(20 * time.Second)
	for {
		q, err := ch.QueueDeclarePassive(queue+".dlq", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Consumers == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed run's consumer is still on %s.dlq", queue)
		}
		time.Sleep(10 * time.Millisecond)
	}

	code, out, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", deadURL, workURL, "--rate", "-1", "--idle", "2s")
	if code != exitOK || !strings.Contains(out, "stopped: backlog") {
		t.Fatalf("second run: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	waitRabbitReady(t, ch, queue+".dlq", 0)

	seen := map[string]int{}
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		id, _ := d.Headers[ackwise.HeaderEventID].(string)
		seen[id]++
	}
	// One publish at a time, each acked as soon as it is confirmed: only
	// the last few before the kill can have lost their ack.
	requireEveryEvent(t, seen, killedAt)
}

// requireEveryEvent fails t unless seen, the count of each event ID in the
// target after a run interrupted at moved moves and a second run, holds
// every one of the deadLetters events and no other, and at most a few
// twice: the moves whose ack (or commit) had not reached the broker.
func requireEveryEvent(t *testing.T, seen map[string]int, moved int) {
	t.Helper()
	dups := 0
	for i := range deadLetters {
		id := fmt.Sprint("e", i)
		switch n := seen[id]; {
		case n == 0:
			t.Errorf("%s lost: in neither destination", id)
		case n > 1:
			dups += n - 1
		}
	}
	if len(seen) != deadLetters {
		t.Errorf("the target holds %d distinct events, want %d", len(seen), deadLetters)
	}
	if dups > 3 {
		t.Errorf("%d duplicates after an interruption at %d moves; want at most a few (acks in flight)", dups, moved)
	}
	t.Logf("interrupted after %d moves; %d duplicate(s)", moved, dups)
}

// cancelAt is a stderr that cancels a run once a progress line says it
// moved at least n messages.
type cancelAt struct {
	mu      sync.Mutex
	n       int
	cancel  context.CancelFunc
	movedAt int // -1 until cancelled
	buf     strings.Builder
}

func (w *cancelAt) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for _, l := range strings.Split(string(p), "\n") {
		if m := progressMoved.FindStringSubmatch(l); m != nil && w.movedAt < 0 {
			if n, _ := strconv.Atoi(m[1]); n >= w.n {
				w.movedAt = n
				w.cancel()
			}
		}
	}
	return len(p), nil
}

// TestKafkaRedriveCancelledMidway: a redrive interrupted in the middle of
// its run (its context cancelled, as SIGINT does), then run again, loses no
// dead letter on Kafka: every event is in the work topic, the group has
// nothing left to read, and the only events found twice are those moved
// but not yet committed when the first run ended.
func TestKafkaRedriveCancelledMidway(t *testing.T) {
	t.Parallel()
	c, addr := kfakeCluster(t)
	topic := fmt.Sprintf("orders-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	createTopic(t, ctx, c, topic, 1)
	createTopic(t, ctx, c, topic+".dlq", 3)
	publishDeadLetters(t, ctx, "kafka://"+addr+"/"+topic+".dlq", topic, deadLetters)
	deadURL := "kafka://" + addr + "/" + topic + ".dlq?group=ops-redrive"
	workURL := "kafka://" + addr + "/" + topic

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var stdout bytes.Buffer
	stderr := &cancelAt{n: 50, cancel: stop, movedAt: -1}
	code := runContext(runCtx, []string{"dlq", "redrive", "--yes", deadURL, workURL, "--rate", "100", "--progress-every", "50ms", "--idle", "20s"}, testEnv(&stdout, stderr))
	if code != exitFailed || stderr.movedAt < 0 || !strings.Contains(stderr.buf.String(), "context canceled") {
		t.Fatalf("first run: exit %d, cancelled at %d\nstdout %s\nstderr %s", code, stderr.movedAt, stdout.String(), stderr.buf.String())
	}
	code, out, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", deadURL, workURL, "--rate", "-1", "--idle", "20s")
	if code != exitOK || !strings.Contains(out, "stopped: backlog") {
		t.Fatalf("second run: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, out, errOut = ackwiseRun(t, "lag", deadURL, "--window", "10ms", "--json")
	var r lagReport
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != exitOK || r.Backlog != 0 {
		t.Fatalf("lag of the dead-letter topic after both runs: exit %d, %v\nstdout %s\nstderr %s", code, err, out, errOut)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	end, _ := ends.Lookup(topic, 0)
	seen := map[string]int{}
	for n := int64(0); n < end.Offset; {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("read %s after %d records: %v", topic, n, err)
		}
		for _, rec := range fs.Records() {
			n++
			for _, h := range rec.Headers {
				if h.Key == ackwise.HeaderEventID {
					seen[string(h.Value)]++
				}
			}
		}
	}
	// The source commits its settled prefix as it closes: only moves not
	// yet marked settled when the run was cancelled can come again.
	requireEveryEvent(t, seen, stderr.movedAt)
}
