package kafka

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

// The test binary re-executes itself as a child process for the tests that
// kill a process: a kfake broker with a data dir, or a consumer.
const childEnv = "ACKWISE_KAFKA_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
		flag.Parse()
		shortParallel()
		os.Exit(m.Run())
	case "kfake":
		os.Exit(runKfakeChild())
	case "crash-consumer":
		os.Exit(runCrashConsumerChild())
	default:
		fmt.Fprintln(os.Stderr, "unknown child", os.Getenv(childEnv))
		os.Exit(2)
	}
}

// shortParallel runs the tests four at a time under -short (the offline
// unit run) unless -parallel is given: they mostly wait, on kfake and on
// their own timers, and go test's default of GOMAXPROCS (2 on the machines
// here) made this package the longest of the run (45s; 25s four at a time).
// `make test` keeps the default.
func shortParallel() {
	if !testing.Short() {
		return
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "4")
	}
}

// runKfakeChild serves a kfake broker on KFAKE_PORT with data in KFAKE_DIR
// until killed, printing "READY" once it listens.
func runKfakeChild() int {
	port, _ := strconv.Atoi(os.Getenv("KFAKE_PORT"))
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.GroupMinSessionTimeout(time.Second), kfake.DataDir(os.Getenv("KFAKE_DIR")), kfake.SyncWrites())
	if err != nil {
		fmt.Fprintln(os.Stderr, "kfake:", err)
		return 1
	}
	fmt.Println("READY", c.ListenAddrs()[0])
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	c.Close()
	return 0
}

// runCrashConsumerChild receives CRASH_N records, acks those whose offset
// is not a multiple of 3, waits until that state is committed, prints
// "READY" and waits to be killed.
func runCrashConsumerChild() int {
	n, _ := strconv.Atoi(os.Getenv("CRASH_N"))
	cfg := SourceConfig{ClientConfig: ClientConfig{Brokers: strings.Split(os.Getenv("CRASH_BROKERS"), ","), Options: []kgo.Opt{kgo.SessionTimeout(2 * time.Second), kgo.HeartbeatInterval(100 * time.Millisecond)}}, Topic: os.Getenv("CRASH_TOPIC"), Group: os.Getenv("CRASH_GROUP"), CommitInterval: 10 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, err := NewSource(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var got []*ackwise.Message
	for len(got) < n {
		buf := make([]*ackwise.Message, 7) // batches that do not line up with the pattern
		k, err := src.Receive(ctx, buf)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		got = append(got, buf[:k]...)
	}
	for i := len(got) - 1; i >= 0; i-- {
		if got[i].Offset%3 != 0 {
			if err := src.Ack(ctx, got[i]); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
	}
	// Wait for the commit (offset 0 and the settled set in its metadata).
	adm := kadm.NewClient(src.Client())
	for {
		offs, err := adm.FetchOffsets(ctx, cfg.Group)
		if err == nil {
			if o, ok := offs.Lookup(cfg.Topic, 0); ok && len(decodeSettled(o.At, o.Metadata)) == n-(n+2)/3 {
				break
			}
		}
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "commit never landed")
			return 1
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("READY")
	select {} // killed with SIGKILL
}

// startChild starts the test binary as a child and waits for its READY
// line, returning the rest of that line.
func startChild(t *testing.T, env ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
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
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "READY"); ok {
				ready <- strings.TrimSpace(rest)
				break
			}
		}
		close(ready)
		for sc.Scan() {
		}
	}()
	select {
	case line, ok := <-ready:
		if !ok {
			t.Fatalf("child %v exited before READY", env)
		}
		return cmd, line
	case <-time.After(30 * time.Second):
		t.Fatalf("child %v not ready after 30s", env)
	}
	return nil, ""
}

// kill9 kills a child with SIGKILL and reaps it.
func kill9(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
