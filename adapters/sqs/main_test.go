package sqs

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// envEndpoint names an SQS endpoint for the tests (an emulator already
// running); unset, TestMain starts local-aws-sqs from testdata/emulator on a
// free loopback port and stops it at the end.
const envEndpoint = "ACKWISE_SQS_ENDPOINT"

// testEndpoint is the endpoint the tests talk to; "" under -short and in
// a fuzz run, where the tests that need SQS skip.
var testEndpoint string

func TestMain(m *testing.M) {
	flag.Parse()
	// A fuzz run (make fuzz) needs no SQS: its target is the URL parser.
	if f := flag.Lookup("test.fuzz"); testing.Short() || f != nil && f.Value.String() != "" {
		os.Exit(m.Run())
	}
	// Dummy credentials and a region for the emulator, and no shared
	// config files or instance metadata: the tests never reach AWS.
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
	os.Unsetenv("AWS_PROFILE")
	os.Unsetenv("AWS_ENDPOINT_URL")
	os.Unsetenv("AWS_ENDPOINT_URL_SQS")
	testEndpoint = os.Getenv(envEndpoint)
	stop := func() {}
	if testEndpoint == "" {
		var err error
		testEndpoint, stop, err = startEmulator()
		if err != nil {
			fmt.Fprintf(os.Stderr, "sqs tests: %v\n", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

// startEmulator starts testdata/emulator/server.js and returns its
// endpoint and a function that stops it.
func startEmulator() (endpoint string, stop func(), err error) {
	dir, _ := filepath.Abs(filepath.Join("testdata", "emulator"))
	fix := fmt.Sprintf("run %s/ensure.sh (it installs node, npm and the pinned local-aws-sqs), or set %s to a running SQS emulator", dir, envEndpoint)
	if _, err := exec.LookPath("node"); err != nil {
		return "", nil, fmt.Errorf("node not found: %s", fix)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "local-aws-sqs", "package.json")); err != nil {
		return "", nil, fmt.Errorf("local-aws-sqs is not installed in %s/node_modules: %s", dir, fix)
	}
	cmd := exec.Command("node", "server.js")
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe() // closed: the emulator exits
	if err != nil {
		return "", nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("start the SQS emulator: %w", err)
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
			return "", nil, fmt.Errorf("the SQS emulator (node %s/server.js) did not start: said %q", dir, l)
		}
		return "http://127.0.0.1:" + port, stop, nil
	case <-time.After(60 * time.Second):
		stop()
		return "", nil, fmt.Errorf("the SQS emulator (node %s/server.js) did not say it listens within 60s", dir)
	}
}

// needSQS skips t under -short (and in a fuzz run) and returns the
// endpoint.
func needSQS(t testing.TB) string {
	t.Helper()
	if testEndpoint == "" {
		t.Skip("needs the SQS emulator (not under -short, nor in a fuzz run)")
	}
	return testEndpoint
}
