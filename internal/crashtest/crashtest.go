// Package crashtest runs a test of the current test binary as a child
// process and kills it with SIGKILL at a point the child announces: the
// usual Go way to test what a crash leaves behind.
package crashtest

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// KillAt runs the test named test (its body reads env to know it is the
// child) in a child process with env added to this process's environment,
// waits until the child prints the line marker on its standard output, and
// kills it with SIGKILL there, so that no deferred code runs. It fails t
// when the child ends, or a minute passes, without printing marker. The
// child's standard error goes to this process's.
func KillAt(t testing.TB, test, marker string, env ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	reached := false
	var lines []string
	for sc.Scan() {
		if sc.Text() == marker {
			reached = true
			break
		}
		lines = append(lines, sc.Text())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if !reached {
		t.Fatalf("child %s never reached %q; its output:\n%s", test, marker, strings.Join(lines, "\n"))
	}
}
