package bench

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// The benchmark binary re-executes itself to serve a kfake broker in a
// process of its own when ACKWISE_BENCH_KFAKE=process (see kafkaCluster).
const kfakeChildEnv = "ACKWISE_BENCH_KFAKE_CHILD"

// kfakePID is the process ID of the running broker process, 0 when there is
// none (the meter reads its CPU time).
var kfakePID atomic.Int64

func TestMain(m *testing.M) {
	if os.Getenv(kfakeChildEnv) != "" {
		os.Exit(serveKfake())
	}
	if os.Getenv(pstestChildEnv) != "" {
		os.Exit(servePstest())
	}
	if os.Getenv(costEnv) != "" {
		os.Exit(serveCost())
	}
	code := m.Run()
	sqsStop() // the SQS emulator, if a benchmark started it
	os.Exit(code)
}

// serveKfake serves a one-broker kfake cluster until SIGTERM, printing
// "READY <addr>" once it listens.
func serveKfake() int {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
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

// kfakeProcess starts a kfake broker in a child process, stopped when b
// ends, and returns its address.
func kfakeProcess(b *testing.B) []string {
	b.Helper()
	return []string{childProcess(b, kfakeChildEnv, &kfakePID)}
}

// childProcess starts this binary again with env set, which serves a
// broker until SIGTERM and prints "READY <addr>" once it listens; it keeps
// the child's process ID in pid while it runs, stops it when b ends, and
// returns the address.
func childProcess(b *testing.B, env string, pid *atomic.Int64) string {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), env+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	pid.Store(int64(cmd.Process.Pid))
	b.Cleanup(func() {
		pid.Store(0)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if addr, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				ready <- addr
				break
			}
		}
		close(ready)
		for sc.Scan() {
		}
	}()
	select {
	case addr, ok := <-ready:
		if !ok {
			b.Fatalf("%s process exited before it listened", env)
		}
		return addr
	case <-time.After(30 * time.Second):
		b.Fatalf("%s process not listening after 30s", env)
	}
	return ""
}
