package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/ackwise/ackwise/adapters/sqs"
)

// nativeFlags are the redrive flags -native takes: SQS's move task has a
// rate and nothing else (no filter, count, dry run or timeouts); --yes
// confirms the run.
var nativeFlags = []string{"native", "rate", "yes"}

// nativeArgs checks the flags set (by name) with -native and returns the
// move task's rate from -rate: whole messages a second, 1 to 500; -1 (no
// cap) lets SQS choose (0).
func nativeArgs(set []string, rate float64) (int, error) {
	var bad []string
	for _, f := range set {
		if !slices.Contains(nativeFlags, f) {
			bad = append(bad, "-"+f)
		}
	}
	if len(bad) > 0 {
		return 0, fmt.Errorf("-native takes only -rate (and -yes): SQS's move task moves every message as it is (%s not taken)", strings.Join(bad, ", "))
	}
	switch {
	case rate == -1:
		return 0, nil
	case rate < 1 || rate > sqs.MaxMoveRate || rate != math.Trunc(rate):
		return 0, fmt.Errorf("-rate = %v with -native: want whole messages a second from 1 to %d, or -1 (SQS's choice)", rate, sqs.MaxMoveRate)
	}
	return int(rate), nil
}

// nativeRedrive moves the messages of the SQS dead-letter queue from (an
// awssqs:// URL, as a source) to the queue to (an awssqs:// URL, as a
// sink) with SQS's own move task (sqs.MoveTask) at most rate a second (0:
// SQS's choice), printing its progress and a summary to stdout. handled is
// false when from is not an awssqs:// URL: -native is for SQS only.
func nativeRedrive(ctx context.Context, from, to string, rate int, stdout io.Writer) (handled bool, err error) {
	fu, err := url.Parse(from)
	if err != nil || !strings.EqualFold(fu.Scheme, sqs.Scheme) {
		return false, nil
	}
	src, err := sqs.ConfigFromURL(fu)
	if err != nil {
		return true, fmt.Errorf("dead-letter queue: %w", err)
	}
	tu, err := url.Parse(to)
	if err != nil || !strings.EqualFold(tu.Scheme, sqs.Scheme) {
		return true, fmt.Errorf("-native moves between two SQS queues: the target %s is not an %s:// URL", redact(to), sqs.Scheme)
	}
	dst, err := sqs.SinkConfigFromURL(tu)
	if err != nil {
		return true, fmt.Errorf("target: %w", err)
	}
	if dst.Region != "" && dst.Region != src.Region || dst.Endpoint != src.Endpoint {
		return true, errors.New("-native: the target's region and endpoint must be the dead-letter queue's (SQS moves within one region)")
	}
	var last int64 = -1
	progress := func(r sqs.MoveResult) {
		if r.Moved != last && r.Status == sqs.MoveRunning {
			last = r.Moved
			fmt.Fprintf(stdout, "moving: %d of %s moved\n", r.Moved, count(r.ToMove))
		}
	}
	res, err := sqs.MoveTask(ctx, src.Connection, src.QueueURL, dst.QueueURL, sqs.MoveOptions{MaxPerSecond: rate, Progress: progress})
	capText := "SQS's choice"
	switch {
	case res.MaxPerSecond > 0:
		capText = fmt.Sprintf("%d/s", res.MaxPerSecond)
	case res.Status == "" && rate > 0:
		capText = fmt.Sprintf("%d/s asked", rate) // no task: SQS reported none
	}
	fmt.Fprintf(stdout, "moved %d from %s to %s by SQS's move task (status %s, rate %s) in %v\n",
		res.Moved, redact(from), redact(to), cmp.Or(res.Status, "not started"), capText, res.Elapsed.Round(time.Millisecond))
	if err != nil {
		return true, fmt.Errorf("redrive -native: %w", err)
	}
	return true, nil
}

// count renders a count SQS may not have given yet (-1).
func count(n int64) string {
	if n < 0 {
		return "?"
	}
	return fmt.Sprint(n)
}
