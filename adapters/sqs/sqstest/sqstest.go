// Package sqstest runs a package's tests against an SQS emulator: the
// local-aws-sqs pinned in adapters/sqs/testdata/emulator (installed by its
// ensure.sh, which make test runs), started on a free loopback port, or
// the endpoint ACKWISE_SQS_ENDPOINT names. The tests of the sqs adapter
// and of the ackwise CLI use it from their TestMain:
//
//	var sqsEndpoint string // "" under -short: the tests that need SQS skip
//
//	func TestMain(m *testing.M) { sqstest.Main(m, &sqsEndpoint) }
//
// It finds the emulator next to its own source file, so it works from a
// test binary built from this module's source tree (not with -trimpath).
package sqstest

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// EnvEndpoint names an SQS endpoint for the tests (an emulator already
// running); unset, Main starts local-aws-sqs and stops it at the end.
const EnvEndpoint = "ACKWISE_SQS_ENDPOINT"

// Main runs m's tests and exits with their code. Under -short and in a fuzz
// run it starts nothing and leaves *endpoint "". Otherwise it gives the
// process dummy AWS credentials and a region and turns off shared config
// files, profiles, endpoint overrides and instance metadata (the tests
// never reach AWS), sets *endpoint to ACKWISE_SQS_ENDPOINT or to the
// emulator it starts, and stops that emulator once the tests ran. An
// emulator that cannot start fails the run with a message saying how to
// install it.
func Main(m *testing.M, endpoint *string) {
	flag.Parse()
	if f := flag.Lookup("test.fuzz"); testing.Short() || f != nil && f.Value.String() != "" {
		os.Exit(m.Run())
	}
	Isolate()
	*endpoint = os.Getenv(EnvEndpoint)
	stop := func() {}
	if *endpoint == "" {
		var err error
		*endpoint, stop, err = Start()
		if err != nil {
			fmt.Fprintf(os.Stderr, "sqs tests: %v\n", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

// Isolate gives the process dummy AWS credentials and a region, and turns
// off shared config files, profiles, endpoint overrides and instance
// metadata, so that nothing the tests or benchmarks run can reach AWS.
func Isolate() {
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID":           "ackwise-test",
		"AWS_SECRET_ACCESS_KEY":       "ackwise-test-secret",
		"AWS_REGION":                  "us-east-1",
		"AWS_EC2_METADATA_DISABLED":   "true",
		"AWS_CONFIG_FILE":             os.DevNull,
		"AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
	} {
		os.Setenv(k, v)
	}
	for _, k := range []string{"AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS", "AWS_SESSION_TOKEN"} {
		os.Unsetenv(k)
	}
}

// Dir is the directory of the pinned emulator
// (adapters/sqs/testdata/emulator of this module's source tree).
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "testdata", "emulator")
}

// Start starts the emulator (node server.js in Dir) on a free loopback
// port and returns its endpoint and a function that stops it. The emulator
// also exits when the process that started it dies (its standard input
// closes).
func Start() (endpoint string, stop func(), err error) {
	endpoint, _, stop, err = StartProcess()
	return endpoint, stop, err
}

// StartProcess is Start, and also returns the emulator's process ID (for
// a benchmark that reads the emulator's CPU time).
func StartProcess() (endpoint string, pid int, stop func(), err error) {
	dir := Dir()
	fix := fmt.Sprintf("run %s/ensure.sh (it installs node, npm and the pinned local-aws-sqs), or set %s to a running SQS emulator", dir, EnvEndpoint)
	if _, err := exec.LookPath("node"); err != nil {
		return "", 0, nil, fmt.Errorf("node not found: %s", fix)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "local-aws-sqs", "package.json")); err != nil {
		return "", 0, nil, fmt.Errorf("local-aws-sqs is not installed in %s/node_modules: %s", dir, fix)
	}
	cmd := exec.Command("node", "server.js")
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe() // closed: the emulator exits
	if err != nil {
		return "", 0, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", 0, nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", 0, nil, fmt.Errorf("start the SQS emulator: %w", err)
	}
	stop = func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		io.Copy(io.Discard, stdout)
	}()
	select {
	case l, ok := <-line:
		port, found := strings.CutPrefix(l, "listening ")
		if !ok || !found {
			stop()
			return "", 0, nil, fmt.Errorf("the SQS emulator (node %s/server.js) did not start: said %q", dir, l)
		}
		return "http://127.0.0.1:" + port, cmd.Process.Pid, stop, nil
	case <-time.After(60 * time.Second):
		stop()
		return "", 0, nil, fmt.Errorf("the SQS emulator (node %s/server.js) did not say it listens within 60s", dir)
	}
}
