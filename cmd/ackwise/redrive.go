package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/sqs"
	"github.com/ackwise/ackwise/dlq"
)

// redriveArgs are redrive's flags.
type redriveArgs struct {
	rate             float64
	max, sample      int
	dry, force, yes  bool
	verbose          bool
	reasons, classes list
	idle, pubTimeout time.Duration
	maxAge           time.Duration
	maxHeld          int
	maxRedrives      int
	progressEvery    time.Duration
	native           bool
}

func redriveCmd(e env) *cobra.Command {
	var a redriveArgs
	c := &cobra.Command{
		Use:   "redrive <dlq-source-url> <target-url> [--rate 10] [--sample K | --max N] [--dry-run] [--reason permanent,...] [--class transient,...] [--max-age D] [--yes]",
		Short: "move dead letters back, at a capped rate",
		Long: `redrive moves dead letters back to <target-url>, the queue or topic their consumer
reads (its own source URL is accepted: the parameters only a source takes are dropped,
with a note), publishing each and acknowledging it at the dead-letter source only once
the publish is confirmed. Redrive only into consumers that deduplicate on the event ID.
It asks for confirmation unless --yes (or --dry-run); without a terminal to ask on, it
refuses to run without --yes. See docs/redrive.md.`,
		Args: positional("<dlq-source-url>", "<target-url>"),
		RunE: func(c *cobra.Command, args []string) error {
			return redrive(c, e, a, args[0], args[1])
		},
	}
	f := c.Flags()
	f.Float64Var(&a.rate, "rate", dlq.DefaultRate, "publish at most `N` messages a second (-1: no cap)")
	f.IntVar(&a.max, "max", 0, "move at most `N` messages (0: no limit); with --dry-run, count at most N")
	f.IntVar(&a.sample, "sample", 0, "move only `K` messages, to watch their consumer handle them before moving the rest (as --max K)")
	f.BoolVar(&a.dry, "dry-run", false, "decide and print, move nothing")
	f.Var(&a.reasons, "reason", "move only dead letters with these `reasons` (comma-separated: "+reasonNames()+")")
	f.Var(&a.classes, "class", "move only dead letters with these error `classes` (comma-separated: "+classNames()+")")
	f.DurationVar(&a.maxAge, "max-age", 0, "leave dead letters written longer ago than `D` where they are, and report them (0: no limit)")
	f.DurationVar(&a.idle, "idle", dlq.DefaultIdleTimeout, "stop when no message arrives for this `long`")
	f.IntVar(&a.maxHeld, "max-held", dlq.DefaultMaxHeld, "hold at most `N` skipped messages unsettled before stopping")
	f.DurationVar(&a.pubTimeout, "publish-timeout", dlq.DefaultPublishTimeout, "fail the run when a publish to the target is not confirmed within this `long` (a target that is down)")
	f.IntVar(&a.maxRedrives, "max-redrives", dlq.DefaultMaxRedrives, "leave dead letters that were redriven `N` times already (their "+dlq.HeaderRedriveCount+" header) where they are, and report them")
	f.BoolVar(&a.force, "force", false, "move the dead letters --max-redrives would leave (never one event twice in a run)")
	f.BoolVarP(&a.verbose, "verbose", "v", false, "print a line for every message, not only in a dry run")
	f.BoolVarP(&a.yes, "yes", "y", false, "do not ask for confirmation")
	f.DurationVar(&a.progressEvery, "progress-every", 5*time.Second, "without a terminal, print a progress line to stderr this `often` (0: none); on a terminal a progress bar shows")
	f.BoolVar(&a.native, "native", false, "awssqs:// only: SQS's own move task (StartMessageMoveTask) at --rate (whole, 1 to 500; -1: SQS's choice), moving every message as it is; takes no other flag but --rate and --yes")
	return c
}

func reasonNames() string {
	s := make([]string, len(dlq.Reasons))
	for i, r := range dlq.Reasons {
		s[i] = string(r)
	}
	return strings.Join(s, ", ")
}

func classNames() string {
	var s []string
	for c := ackwise.ClassTransient; ; c++ {
		if _, err := ackwise.ParseClass(c.String()); err != nil {
			return strings.Join(s, ", ")
		}
		s = append(s, c.String())
	}
}

// options checks a and returns the dlq.RedriveOptions it asks for (without
// the callbacks).
func (a redriveArgs) options(c *cobra.Command) (dlq.RedriveOptions, error) {
	switch {
	case a.rate == 0:
		return dlq.RedriveOptions{}, usageErr(c, "--rate = 0: want messages per second, or -1 for no cap")
	case a.idle <= 0:
		return dlq.RedriveOptions{}, usageErr(c, "--idle = %v: want a positive duration", a.idle)
	case a.pubTimeout <= 0:
		return dlq.RedriveOptions{}, usageErr(c, "--publish-timeout = %v: want a positive duration", a.pubTimeout)
	case a.maxHeld < 1:
		return dlq.RedriveOptions{}, usageErr(c, "--max-held = %d: want at least 1", a.maxHeld)
	case a.maxRedrives < 1:
		return dlq.RedriveOptions{}, usageErr(c, "--max-redrives = %d: want at least 1 (--force moves every dead letter)", a.maxRedrives)
	case a.sample < 0:
		return dlq.RedriveOptions{}, usageErr(c, "--sample = %d: want a positive count", a.sample)
	case a.sample > 0 && a.max > 0:
		return dlq.RedriveOptions{}, usageErr(c, "--sample and --max both given: --sample K is --max K")
	case a.progressEvery < 0:
		return dlq.RedriveOptions{}, usageErr(c, "--progress-every = %v: want a duration, 0 for none", a.progressEvery)
	}
	for _, r := range a.reasons {
		if _, err := dlq.ParseReason(r); err != nil {
			return dlq.RedriveOptions{}, usageErr(c, "--reason %s: unknown reason (known: %s)", field(r), reasonNames())
		}
	}
	for _, cl := range a.classes {
		if _, err := ackwise.ParseClass(cl); err != nil {
			return dlq.RedriveOptions{}, usageErr(c, "--class %s: unknown error class (known: %s)", field(cl), classNames())
		}
	}
	opts := dlq.RedriveOptions{Rate: a.rate, Max: cmp.Or(a.sample, a.max), DryRun: a.dry, IdleTimeout: a.idle, MaxHeld: a.maxHeld,
		PublishTimeout: a.pubTimeout, MaxRedrives: a.maxRedrives, Force: a.force, MaxAge: a.maxAge}
	if err := opts.Validate(); err != nil {
		return opts, usageErr(c, "%v", err)
	}
	if len(a.reasons) > 0 || len(a.classes) > 0 {
		reasons, classes := a.reasons, a.classes
		opts.Filter = func(_ *ackwise.Message, env dlq.Envelope) bool {
			return (len(reasons) == 0 || slices.Contains(reasons, string(env.Reason))) &&
				(len(classes) == 0 || slices.Contains(classes, env.ErrorClass))
		}
	}
	return opts, nil
}

// targetURL turns the target into a sink URL: a consumer's source URL
// loses the parameters only a source takes, with a note on stderr.
func targetURL(stderr io.Writer, raw string) string {
	sink, dropped, err := adapters.SinkURL(raw)
	if err != nil {
		return raw // the opener reports it
	}
	if len(dropped) > 0 {
		fmt.Fprintf(stderr, "ackwise: note: the target is used as a sink: dropped its source parameters %s\n", strings.Join(dropped, ", "))
	}
	return sink
}

func redrive(c *cobra.Command, e env, a redriveArgs, from, to string) (err error) {
	ctx := c.Context()
	opts, err := a.options(c)
	if err != nil {
		return err
	}
	if err := checkURLs(c, e, from, to); err != nil {
		return err
	}
	if sameDestination(from, to) {
		return usageErr(c, "the dead-letter source and the target are the same destination (%s)", redact(from))
	}
	if a.native {
		return redriveNative(c, e, a, from, to)
	}
	if !a.dry && !a.yes && !e.stdinTerminal {
		return usageErr(c, "redrive moves messages: give --yes to confirm (stdin is not a terminal, so it cannot ask), or --dry-run to look first")
	}
	to = targetURL(e.stderr, to)
	src, err := openSource(ctx, from)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := src.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close source %s: %w", redact(from), cerr)
		}
	}()
	// Opened in a dry run too, so that a dry run fails where the real run
	// would; it publishes nothing then.
	sink, err := adapters.OpenSink(ctx, to)
	if err != nil {
		return fmt.Errorf("open target: %w", err)
	}
	defer func() {
		if cerr := sink.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close target %s: %w", redact(to), cerr)
		}
	}()
	if !a.dry && !a.yes {
		if err := confirm(ctx, e, src, a, from, to); err != nil {
			return err
		}
	}
	var target dlq.RedriveSink = sink
	if a.dry {
		target = nil // Redrive moves nothing without a sink
	}
	p := newProgress(e, a)
	opts.OnStart = p.start
	opts.OnMessage = func(msg *ackwise.Message, env dlq.Envelope, act dlq.Action) {
		line := ""
		switch {
		// Dead letters left where they were are always reported.
		case a.dry, a.verbose, act == dlq.ActionFailed, act == dlq.ActionRedriveLimit, act == dlq.ActionAlreadyMoved,
			act == dlq.ActionPayloadCut, act == dlq.ActionTooOld:
			l := dlq.Letter{Message: msg, Envelope: env}
			if act == dlq.ActionNoEnvelope {
				l.Err = errors.New("no envelope")
			}
			line = fmt.Sprintf("%s %s", act, letterLine(l))
		}
		p.note(act, line)
	}
	res, rerr := dlq.Redrive(ctx, src, target, opts)
	p.stop()
	printSummary(e, a, res, from, to)
	if rerr != nil {
		return fmt.Errorf("redrive: %w", rerr)
	}
	return nil
}

// redriveNative is redrive --native: SQS's move task (nativeRedrive).
func redriveNative(c *cobra.Command, e env, a redriveArgs, from, to string) error {
	var set []string
	c.Flags().Visit(func(f *pflag.Flag) { set = append(set, f.Name) })
	rate, err := nativeArgs(set, a.rate)
	if err != nil {
		return usageErr(c, "%v", err)
	}
	if u, err := url.Parse(from); err != nil || !strings.EqualFold(u.Scheme, sqs.Scheme) {
		return usageErr(c, "--native: %s is not an awssqs:// URL (SQS's move task moves between SQS queues)", redact(from))
	}
	if !a.yes {
		if !e.stdinTerminal {
			return usageErr(c, "redrive moves messages: give --yes to confirm (stdin is not a terminal, so it cannot ask)")
		}
		if err := confirm(c.Context(), e, nil, a, from, to); err != nil {
			return err
		}
	}
	_, err = nativeRedrive(c.Context(), from, to, rate, e.stdout)
	return err
}

// confirm asks on stderr, and reads the answer on stdin; src, when not
// nil, tells the depth.
func confirm(ctx context.Context, e env, src adapters.Source, a redriveArgs, from, to string) error {
	held := ""
	if b, ok := src.(dlq.Backlogger); ok {
		if n, err := b.Backlog(ctx); err == nil {
			held = fmt.Sprintf(" (it holds %d)", n)
		}
	}
	what := "every dead letter"
	if n := max(a.max, a.sample); n > 0 {
		what = fmt.Sprintf("up to %d dead letters", n)
	}
	var filter []string
	if len(a.reasons) > 0 {
		filter = append(filter, "reason "+a.reasons.String())
	}
	if len(a.classes) > 0 {
		filter = append(filter, "error class "+a.classes.String())
	}
	if a.maxAge > 0 {
		filter = append(filter, fmt.Sprintf("written within %v", a.maxAge))
	}
	if len(filter) > 0 {
		what += " with " + strings.Join(filter, ", ")
	}
	rate := "no rate cap"
	if a.rate > 0 {
		rate = fmt.Sprintf("at most %v a second", a.rate)
	}
	fmt.Fprintf(e.stderr, "Move %s from %s%s to %s, %s? [y/N] ", what, redact(from), held, redact(to), rate)
	line, err := bufio.NewReader(e.stdin).ReadString('\n')
	if err != nil && line == "" {
		fmt.Fprintln(e.stderr)
		return errors.New("redrive not confirmed (no answer): nothing moved")
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return errors.New("redrive not confirmed: nothing moved")
}

func printSummary(e env, a redriveArgs, res dlq.RedriveResult, from, to string) {
	verb := "moved"
	n := res.Moved
	if a.dry {
		verb, n = "would move", res.WouldMove
	}
	left := ""
	if res.TooOld > 0 {
		left += fmt.Sprintf("; left %d written more than --max-age %v ago", res.TooOld, a.maxAge)
	}
	if res.RedriveLimited > 0 {
		left += fmt.Sprintf("; left %d redriven %d times already (--force moves them)", res.RedriveLimited, a.maxRedrives)
	}
	if res.AlreadyMoved > 0 {
		left += fmt.Sprintf("; left %d whose event this run moved already", res.AlreadyMoved)
	}
	if res.PayloadCut > 0 {
		left += fmt.Sprintf("; left %d whose payload was cut to fit the dead-letter destination", res.PayloadCut)
	}
	stop := stopText(res.Stop, max(a.max, a.sample), res.Backlog, a.idle)
	if a.sample > 0 && res.Stop == dlq.StopMax {
		stop = fmt.Sprintf("sample (%d moved: watch their consumer handle them, then redrive the rest)", a.sample)
	}
	fmt.Fprintf(e.stdout, "%s %d from %s to %s; skipped %d (%d without envelope); failed %d%s; stopped: %s in %v\n",
		verb, n, redact(from), redact(to), res.Skipped, res.NoEnvelope, res.Failed, left, stop, res.Elapsed.Round(time.Millisecond))
	if res.ReleaseFailed > 0 {
		fmt.Fprintf(e.stderr, "ackwise: warning: %d held message(s) could not be released; the broker redelivers them when their lease ends\n", res.ReleaseFailed)
	}
}

// progress shows how a redrive goes: a progress bar on a terminal
// (count, rate, ETA), else a plain line every --progress-every on stderr.
// Its methods are called from Redrive's goroutine, but for the ticker's.
type progress struct {
	e      env
	every  time.Duration
	maxN   int // --max or --sample, 0: none
	seen   atomic.Int64
	moved  atomic.Int64
	total  atomic.Int64 // what the run will see at most, -1: unknown
	began  time.Time
	bar    *progressbar.ProgressBar
	done   chan struct{}
	wg     sync.WaitGroup
	dryRun bool
}

func newProgress(e env, a redriveArgs) *progress {
	p := &progress{e: e, every: a.progressEvery, maxN: max(a.max, a.sample), done: make(chan struct{}), dryRun: a.dry}
	p.total.Store(-1)
	return p
}

// start is RedriveOptions.OnStart: the run begins with backlog messages
// (-1: unknown).
func (p *progress) start(backlog int) {
	p.began = time.Now()
	p.total.Store(int64(backlog))
	if p.every == 0 {
		return
	}
	if p.e.stderrTerminal {
		p.bar = progressbar.NewOptions64(int64(backlog),
			progressbar.OptionSetWriter(p.e.stderr),
			progressbar.OptionSetDescription("redrive"),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("msg"),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			// The bar stays, with the run's count and rate, on a line of
			// its own.
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(p.e.stderr) }),
		)
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(p.every)
		defer t.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-t.C:
				fmt.Fprintln(p.e.stderr, p.line())
			}
		}
	}()
}

// note counts one decision and prints its line, if any, on stdout (with
// the bar out of the way).
func (p *progress) note(act dlq.Action, line string) {
	p.seen.Add(1)
	if act == dlq.ActionMoved || act == dlq.ActionWouldMove {
		p.moved.Add(1)
	}
	if p.bar == nil {
		if line != "" {
			fmt.Fprintln(p.e.stdout, line)
		}
		return
	}
	if line != "" {
		_ = p.bar.Clear()
		fmt.Fprintln(p.e.stdout, line)
	}
	verb := "moved"
	if p.dryRun {
		verb = "would move"
	}
	p.bar.Describe(fmt.Sprintf("redrive: %s %d", verb, p.moved.Load()))
	_ = p.bar.Add(1)
}

// line is one plain progress line.
func (p *progress) line() string {
	seen, moved, total := p.seen.Load(), p.moved.Load(), p.total.Load()
	elapsed := time.Since(p.began)
	rate := float64(seen) / elapsed.Seconds()
	verb := "moved"
	if p.dryRun {
		verb = "would move"
	}
	s := fmt.Sprintf("progress: %s %d, seen %d", verb, moved, seen)
	if total >= 0 {
		s += fmt.Sprintf(" of %d", total)
	}
	s += fmt.Sprintf(", %.1f msg/s, elapsed %v", rate, elapsed.Round(time.Second))
	left := total - seen
	if p.maxN > 0 && (total < 0 || int64(p.maxN)-moved < left) {
		left = int64(p.maxN) - moved
	}
	switch {
	case total < 0 && p.maxN == 0:
		s += ", eta unknown (the source cannot tell its depth)"
	case rate > 0 && left >= 0:
		s += fmt.Sprintf(", eta %v", time.Duration(float64(left)/rate*float64(time.Second)).Round(time.Second))
	}
	return s
}

func (p *progress) stop() {
	close(p.done)
	p.wg.Wait()
	switch {
	case p.bar == nil:
	case p.seen.Load() == p.total.Load():
		_ = p.bar.Finish()
	default:
		// Stopped before the end (--sample, --max, an error): not filled
		// up; the summary says what was done.
		_ = p.bar.Exit()
	}
}

// list is a comma-separated flag value.
type list []string

func (l *list) String() string { return strings.Join(*l, ",") }

func (l *list) Type() string { return "list" }

func (l *list) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			// Not skipped: an unset shell variable would otherwise turn
			// the filter off, and move every message.
			return fmt.Errorf("empty value in %q", v)
		}
		*l = append(*l, s)
	}
	return nil
}
