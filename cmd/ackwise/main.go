package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"

	// Adapters register their URL schemes when imported.
	_ "github.com/ackwise/ackwise/adapters/gcppubsub"
	_ "github.com/ackwise/ackwise/adapters/kafka"
	_ "github.com/ackwise/ackwise/adapters/memory"
	_ "github.com/ackwise/ackwise/adapters/rabbitmq"
	_ "github.com/ackwise/ackwise/adapters/sqs"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailed  = 1
	exitUsage   = 2
	maxErrorLen = 200 // runes of the error text on an inspect line
	maxSample   = 100000
)

const usageTop = `usage: ackwise dlq <command> [arguments]

commands:
  inspect <source-url>                   print dead letters, one a line; consumes nothing
  stats   <source-url>                   count dead letters by reason, error class and source; consumes nothing
  redrive <dlq-source-url> <target-url>  move dead letters back, at a capped rate

Run "ackwise dlq <command> -h" for a command's flags. See docs/redrive.md.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command line args (without the program name), writing
// results to stdout and diagnostics to stderr, and returns the exit status.
// An interrupt (SIGINT, SIGTERM) cancels the run; held dead letters are still
// released.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runContext(ctx, args, stdout, stderr)
}

// usageError is a command line mistake: exit status 2 with a usage message.
type usageError struct {
	msg   string
	usage string
}

func (e *usageError) Error() string { return e.msg }

// errHelp is returned when help was asked for: usage on stdout, status 0.
type errHelp struct{ usage string }

func (e *errHelp) Error() string { return "help requested" }

func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := dispatch(ctx, args, stdout, stderr)
	var ue *usageError
	var he *errHelp
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &he):
		fmt.Fprint(stdout, he.usage)
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "ackwise: %s\n\n%s", ue.msg, ue.usage)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "ackwise: %v\n", err)
		return exitFailed
	}
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return &usageError{msg: "no command given", usage: usageTop}
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		return &errHelp{usage: usageTop}
	case "dlq":
	default:
		return &usageError{msg: fmt.Sprintf("unknown command %q", args[0]), usage: usageTop}
	}
	if len(args) < 2 {
		return &usageError{msg: "dlq: no subcommand given", usage: usageTop}
	}
	switch args[1] {
	case "inspect":
		return cmdInspect(ctx, args[2:], stdout)
	case "stats":
		return cmdStats(ctx, args[2:], stdout)
	case "redrive":
		return cmdRedrive(ctx, args[2:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		return &errHelp{usage: usageTop}
	}
	return &usageError{msg: fmt.Sprintf("dlq: unknown subcommand %q", args[1]), usage: usageTop}
}

// command is one subcommand's flag set and its usage text.
type command struct {
	fs       *flag.FlagSet
	synopsis string
}

func newCommand(name, synopsis string) *command {
	fs := flag.NewFlagSet("ackwise dlq "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return &command{fs: fs, synopsis: synopsis}
}

func (c *command) usage() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "usage: %s\n\nflags:\n", c.synopsis)
	c.fs.SetOutput(&sb)
	c.fs.PrintDefaults()
	c.fs.SetOutput(io.Discard)
	return sb.String()
}

func (c *command) usageErr(format string, a ...any) error {
	return &usageError{msg: fmt.Sprintf(format, a...), usage: c.usage()}
}

// parse parses flags placed before, between or after the positional
// arguments, and checks that there are exactly want positional arguments.
func (c *command) parse(args []string, want ...string) ([]string, error) {
	var pos []string
	for {
		if err := c.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, &errHelp{usage: c.usage()}
			}
			return nil, c.usageErr("%v", err)
		}
		args = c.fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if len(pos) != len(want) {
		return nil, c.usageErr("want %d argument(s) (%s), got %d", len(want), strings.Join(want, " "), len(pos))
	}
	for i, p := range pos {
		if p == "" {
			return nil, c.usageErr("%s is empty", want[i])
		}
	}
	return pos, nil
}

// redact returns rawURL with any password replaced, for messages
// (adapters.RedactURL, unquoted: it also hides a password misplaced by an
// unescaped '/', '?' or '#').
func redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "<malformed URL>"
	}
	r := adapters.RedactURL(u)
	if s, err := strconv.Unquote(r); err == nil {
		return s
	}
	return r
}

func openSource(ctx context.Context, rawURL string) (adapters.Source, error) {
	src, err := adapters.OpenSource(ctx, rawURL)
	if err != nil {
		// Opener errors never contain the password; they name the URL.
		return nil, fmt.Errorf("open source: %w", err)
	}
	return src, nil
}

// parseSample defines and parses the flags of a command that samples a
// dead-letter source, <source-url> [-n N] [-idle d] [-json] (-n defaulting
// to n), and checks them.
func parseSample(c *command, args []string, n int, jsonHelp string) (sampleArgs, error) {
	nf := c.fs.Int("n", n, "receive at most `N` messages (all are released afterwards)")
	idle := c.fs.Duration("idle", dlq.DefaultIdleTimeout, "stop when no message arrives for this `long`")
	asJSON := c.fs.Bool("json", false, jsonHelp)
	pos, err := c.parse(args, "<source-url>")
	if err != nil {
		return sampleArgs{}, err
	}
	if err := checkSample(c, *nf, *idle); err != nil {
		return sampleArgs{}, err
	}
	return sampleArgs{url: pos[0], n: *nf, idle: *idle, asJSON: *asJSON}, nil
}

// sampleArgs are the arguments of the commands that sample a dead-letter
// source (inspect, stats).
type sampleArgs struct {
	url    string
	n      int
	idle   time.Duration
	asJSON bool
}

func checkSample(c *command, n int, idle time.Duration) error {
	if n < 1 || n > maxSample {
		return c.usageErr("-n = %d: want 1 to %d", n, maxSample)
	}
	if idle <= 0 {
		return c.usageErr("-idle = %v: want a positive duration", idle)
	}
	return nil
}

// withSource opens rawURL, runs f on the source and closes it.
func withSource(ctx context.Context, rawURL string, f func(src adapters.Source) error) (err error) {
	src, err := openSource(ctx, rawURL)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := src.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close source %s: %w", redact(rawURL), cerr)
		}
	}()
	return f(src)
}

// sample receives up to n messages from rawURL and releases them all.
func sample(ctx context.Context, rawURL string, n int, idle time.Duration) (res dlq.InspectResult, err error) {
	err = withSource(ctx, rawURL, func(src adapters.Source) error {
		res, err = sampleFrom(ctx, src, rawURL, n, idle)
		return err
	})
	return res, err
}

// sampleFrom receives up to n messages from src (opened from rawURL) and
// releases them all.
func sampleFrom(ctx context.Context, src adapters.Source, rawURL string, n int, idle time.Duration) (res dlq.InspectResult, err error) {
	res, err = dlq.Inspect(ctx, src, dlq.InspectOptions{Max: n, IdleTimeout: idle})
	if err != nil {
		return res, fmt.Errorf("inspect %s: %w", redact(rawURL), err)
	}
	if res.ReleaseFailed > 0 {
		return res, fmt.Errorf("inspect %s: %d message(s) could not be released; the broker redelivers them when their lease ends", redact(rawURL), res.ReleaseFailed)
	}
	return res, nil
}

func cmdInspect(ctx context.Context, args []string, stdout io.Writer) error {
	c := newCommand("inspect", "ackwise dlq inspect <source-url> [-n 20] [-json] [-idle 2s]")
	a, err := parseSample(c, args, dlq.DefaultInspectMax, "print one JSON object a line")
	if err != nil {
		return err
	}
	res, err := sample(ctx, a.url, a.n, a.idle)
	// Print what was seen even when the run ended with an error.
	enc := json.NewEncoder(stdout)
	for _, l := range res.Letters {
		if a.asJSON {
			if jerr := enc.Encode(letterJSON(l)); jerr != nil {
				return jerr
			}
			continue
		}
		fmt.Fprintln(stdout, letterLine(l))
	}
	return err
}

// letterLine renders a dead letter on one line: event ID (quoted if it
// holds spaces, quotes or what is not printable), then key=value fields,
// the error text last, quoted and cut to maxErrorLen runes.
func letterLine(l dlq.Letter) string {
	m, e := l.Message, l.Envelope
	// Quoted when need be: a foreign producer's ID may hold a newline.
	id := field(m.EventID())
	if l.Err != nil {
		return fmt.Sprintf("%s no-envelope broker-id=%s (%v)", id, field(m.BrokerID), l.Err)
	}
	last := "-"
	if !e.LastFailure.IsZero() {
		last = e.LastFailure.UTC().Format(time.RFC3339)
	}
	redrives := ""
	if v, ok := m.Headers.Lookup(dlq.HeaderRedriveCount); ok {
		redrives = " redrives=" + field(cut(v, 20))
	}
	return fmt.Sprintf("%s reason=%s class=%s attempts=%d%s source=%s last-failure=%s error=%q",
		id, field(string(e.Reason)), field(e.ErrorClass), e.Attempts, redrives, field(e.Source), last, cut(e.Error, maxErrorLen))
}

// field renders a value that should be one word: "-" when empty, quoted
// when it holds spaces or quotes.
func field(s string) string {
	if s == "" {
		return "-"
	}
	if strings.ContainsAny(s, " \t\n\"=") || !strconv.CanBackquote(s) {
		return strconv.Quote(s)
	}
	return s
}

// cut returns the first n runes of s, with "…" when it cut.
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	i := 0
	for k := range s {
		if i == n {
			return s[:k] + "…"
		}
		i++
	}
	return s
}

type letterOut struct {
	EventID         string     `json:"event_id"`
	Key             string     `json:"key,omitempty"`
	BrokerID        string     `json:"broker_id,omitempty"`
	DeadLetter      bool       `json:"dead_letter"`
	EnvelopeError   string     `json:"envelope_error,omitempty"`
	Reason          string     `json:"reason,omitempty"`
	ErrorClass      string     `json:"error_class,omitempty"`
	Error           string     `json:"error,omitempty"`
	Source          string     `json:"source,omitempty"`
	Partition       *int32     `json:"partition,omitempty"`
	Offset          *int64     `json:"offset,omitempty"`
	MessageID       string     `json:"message_id,omitempty"`
	Attempts        int        `json:"attempts,omitempty"`
	RedriveCount    string     `json:"redrive_count,omitempty"`
	FirstFailure    *time.Time `json:"first_failure,omitempty"`
	LastFailure     *time.Time `json:"last_failure,omitempty"`
	Consumer        string     `json:"consumer,omitempty"`
	ConsumerVersion string     `json:"consumer_version,omitempty"`
	PayloadBytes    int        `json:"payload_bytes"`
}

func letterJSON(l dlq.Letter) letterOut {
	m, e := l.Message, l.Envelope
	o := letterOut{
		EventID:      m.EventID(),
		Key:          m.Key,
		BrokerID:     m.BrokerID,
		PayloadBytes: len(m.Payload),
	}
	if l.Err != nil {
		o.EnvelopeError = l.Err.Error()
		return o
	}
	o.DeadLetter = true
	o.Reason, o.ErrorClass, o.Error, o.Source = string(e.Reason), e.ErrorClass, e.Error, e.Source
	o.MessageID, o.Attempts, o.Consumer, o.ConsumerVersion = e.MessageID, e.Attempts, e.Consumer, e.ConsumerVersion
	o.RedriveCount = m.Headers.Get(dlq.HeaderRedriveCount)
	if e.Partition >= 0 {
		o.Partition = &e.Partition
	}
	if e.Offset >= 0 {
		o.Offset = &e.Offset
	}
	if !e.FirstFailure.IsZero() {
		o.FirstFailure = &e.FirstFailure
	}
	if !e.LastFailure.IsZero() {
		o.LastFailure = &e.LastFailure
	}
	return o
}

// byCount returns m's keys, most frequent first, then by name.
func byCount(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Or(cmp.Compare(m[b], m[a]), cmp.Compare(a, b))
	})
	return keys
}

// stopText explains s; n is the run's -n or -max, backlog what the source
// held at the start (dlq.RedriveResult.Backlog).
func stopText(s dlq.StopReason, n, backlog int, idle time.Duration) string {
	switch s {
	case dlq.StopIdle:
		return fmt.Sprintf("idle (no message within %v: drained, or the broker holds back more deliveries)", idle)
	case dlq.StopMax:
		return fmt.Sprintf("max (%d reached; there may be more)", n)
	case dlq.StopHeldLimit:
		return "held-limit (too many messages held unsettled; narrow the filter or raise -max-held)"
	case dlq.StopRepeat:
		return "repeat (a held message came back: every message was seen)"
	case dlq.StopBacklog:
		return fmt.Sprintf("backlog (received the %d messages the destination held at the start; dead letters that came back since are left for a later run)", backlog)
	case dlq.StopMovedLimit:
		return fmt.Sprintf("moved-limit (%d events moved, the most one run remembers; run again for the rest)", dlq.MaxMovedIDs)
	}
	return string(s)
}

// list is a comma-separated flag value.
type list []string

func (l *list) String() string { return strings.Join(*l, ",") }

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

func cmdRedrive(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	c := newCommand("redrive", "ackwise dlq redrive <dlq-source-url> <target-sink-url> [-rate 10] [-max N] [-dry-run] [-reason permanent] [-idle 2s] [-publish-timeout 30s] [-max-redrives 3] [-force] [-native]")
	rateF := c.fs.Float64("rate", dlq.DefaultRate, "publish at most `N` messages a second (-1: no cap)")
	maxF := c.fs.Int("max", 0, "move at most `N` messages (0: no limit); with -dry-run, count at most N")
	dry := c.fs.Bool("dry-run", false, "decide and print, move nothing")
	var reasons, classes list
	c.fs.Var(&reasons, "reason", "move only dead letters with these `reasons` (comma-separated: permanent, max-attempts, expired, …)")
	c.fs.Var(&classes, "class", "move only dead letters with these error `classes` (comma-separated: transient, permanent, …)")
	idle := c.fs.Duration("idle", dlq.DefaultIdleTimeout, "stop when no message arrives for this `long`")
	maxHeld := c.fs.Int("max-held", dlq.DefaultMaxHeld, "hold at most `N` skipped messages unsettled before stopping")
	pubTimeout := c.fs.Duration("publish-timeout", dlq.DefaultPublishTimeout, "fail the run when a publish to the target is not confirmed within this `long` (a target that is down)")
	maxRedrives := c.fs.Int("max-redrives", dlq.DefaultMaxRedrives, "leave dead letters that were redriven `N` times already (their "+dlq.HeaderRedriveCount+" header) where they are, and report them")
	force := c.fs.Bool("force", false, "move the dead letters -max-redrives would leave (never one event twice in a run)")
	verbose := c.fs.Bool("v", false, "print a line for every message, not only in a dry run")
	native := c.fs.Bool("native", false, "awssqs:// only: SQS's own move task (StartMessageMoveTask) at -rate (whole, 1 to 500; -1: SQS's choice), moving every message as it is; takes no other flag")
	pos, err := c.parse(args, "<dlq-source-url>", "<target-sink-url>")
	if err != nil {
		return err
	}
	if *rateF == 0 {
		return c.usageErr("-rate = 0: want messages per second, or -1 for no cap")
	}
	if *idle <= 0 {
		return c.usageErr("-idle = %v: want a positive duration", *idle)
	}
	if *pubTimeout <= 0 {
		return c.usageErr("-publish-timeout = %v: want a positive duration", *pubTimeout)
	}
	if *maxHeld < 1 {
		return c.usageErr("-max-held = %d: want at least 1", *maxHeld)
	}
	if *maxRedrives < 1 {
		return c.usageErr("-max-redrives = %d: want at least 1 (-force moves every dead letter)", *maxRedrives)
	}
	if sameDestination(pos[0], pos[1]) {
		return c.usageErr("the dead-letter source and the target are the same destination (%s)", redact(pos[0]))
	}
	if *native {
		var set []string
		c.fs.Visit(func(f *flag.Flag) { set = append(set, f.Name) })
		rate, err := nativeArgs(set, *rateF)
		if err != nil {
			return c.usageErr("%v", err)
		}
		if handled, err := nativeRedrive(ctx, pos[0], pos[1], rate, stdout); handled {
			return err
		}
		return c.usageErr("-native: %s is not an awssqs:// URL (SQS's move task moves between SQS queues)", redact(pos[0]))
	}
	opts := dlq.RedriveOptions{Rate: *rateF, Max: *maxF, DryRun: *dry, IdleTimeout: *idle, MaxHeld: *maxHeld, PublishTimeout: *pubTimeout, MaxRedrives: *maxRedrives, Force: *force}
	if err := opts.Validate(); err != nil {
		return c.usageErr("%v", err)
	}
	if len(reasons) > 0 || len(classes) > 0 {
		opts.Filter = func(_ *ackwise.Message, env dlq.Envelope) bool {
			return (len(reasons) == 0 || slices.Contains(reasons, string(env.Reason))) &&
				(len(classes) == 0 || slices.Contains(classes, env.ErrorClass))
		}
	}
	opts.OnMessage = func(msg *ackwise.Message, env dlq.Envelope, a dlq.Action) {
		// Dead letters left where they were are always reported.
		if *dry || *verbose || a == dlq.ActionFailed || a == dlq.ActionRedriveLimit || a == dlq.ActionAlreadyMoved || a == dlq.ActionPayloadCut {
			l := dlq.Letter{Message: msg, Envelope: env}
			if a == dlq.ActionNoEnvelope {
				l.Err = errors.New("no envelope")
			}
			fmt.Fprintf(stdout, "%s %s\n", a, letterLine(l))
		}
	}

	src, err := openSource(ctx, pos[0])
	if err != nil {
		return err
	}
	defer func() {
		if cerr := src.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close source %s: %w", redact(pos[0]), cerr)
		}
	}()
	// Opened in a dry run too, so that a dry run fails where the real run
	// would; it publishes nothing then.
	sink, err := adapters.OpenSink(ctx, pos[1])
	if err != nil {
		return fmt.Errorf("open target: %w", err)
	}
	defer func() {
		if cerr := sink.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close target %s: %w", redact(pos[1]), cerr)
		}
	}()
	target := sink
	if *dry {
		target = nil // Redrive moves nothing without a sink
	}
	res, rerr := dlq.Redrive(ctx, src, target, opts)
	verb := "moved"
	n := res.Moved
	if *dry {
		verb, n = "would move", res.WouldMove
	}
	left := ""
	if res.RedriveLimited > 0 {
		left += fmt.Sprintf("; left %d redriven %d times already (-force moves them)", res.RedriveLimited, *maxRedrives)
	}
	if res.AlreadyMoved > 0 {
		left += fmt.Sprintf("; left %d whose event this run moved already", res.AlreadyMoved)
	}
	if res.PayloadCut > 0 {
		left += fmt.Sprintf("; left %d whose payload was cut to fit the dead-letter destination", res.PayloadCut)
	}
	fmt.Fprintf(stdout, "%s %d from %s to %s; skipped %d (%d without envelope); failed %d%s; %s in %v\n",
		verb, n, redact(pos[0]), redact(pos[1]), res.Skipped, res.NoEnvelope, res.Failed, left,
		"stopped: "+stopText(res.Stop, *maxF, res.Backlog, *idle), res.Elapsed.Round(time.Millisecond))
	if res.ReleaseFailed > 0 {
		fmt.Fprintf(stderr, "ackwise: warning: %d held message(s) could not be released; the broker redelivers them when their lease ends\n", res.ReleaseFailed)
	}
	if rerr != nil {
		return fmt.Errorf("redrive: %w", rerr)
	}
	return nil
}

// sameDestination reports whether two URLs name the same destination:
// the same scheme, host and path (destPath: a RabbitMQ target's routing
// key too), whatever the rest of the query (a source URL carries ?group=, a
// sink URL need not), the user info, the case of the scheme and
// host, and a trailing '/'; amqp, amqps and rabbit count as one scheme, a
// broker's default ports as no port, a RabbitMQ vhost as part of the path.
// URLs that do not parse are left to the opener.
func sameDestination(a, b string) bool {
	ua, err := url.Parse(a)
	if err != nil {
		return false
	}
	ub, err := url.Parse(b)
	if err != nil {
		return false
	}
	return destScheme(ua) == destScheme(ub) && destHost(ua) == destHost(ub) &&
		destPath(ua) == destPath(ub) && ua.Opaque == ub.Opaque
}

// destPath is the queue or topic u names: its path without '/' at either
// end, or, for a RabbitMQ URL with a routing_key and no exchange, the
// routing key (a sink publishes through the default exchange to the queue
// of that name, whatever the path: rabbitmq.SinkConfigFromURL).
// A RabbitMQ queue is named within its vhost, which comes first.
func destPath(u *url.URL) string {
	if destScheme(u) == "amqp" {
		// u.Query(), as the RabbitMQ opener reads it.
		q := u.Query()
		vhost := cmp.Or(q.Get("vhost"), "/")
		if q.Get("routing_key") != "" && q.Get("exchange") == "" {
			return vhost + "\x00" + q.Get("routing_key")
		}
		return vhost + "\x00" + strings.Trim(u.Path, "/")
	}
	return strings.Trim(u.Path, "/")
}

// destScheme is u's scheme in lower case, the RabbitMQ ones (amqp, amqps,
// rabbit) as one: they reach the same broker.
func destScheme(u *url.URL) string {
	s := strings.ToLower(u.Scheme)
	if s == "amqps" || s == "rabbit" {
		return "amqp"
	}
	return s
}

// destHost is u's host in lower case, without the broker's default ports
// (RabbitMQ's, Kafka's 9092, SQS's 443); a Kafka URL's hosts in sorted order (the
// client takes them as a set).
func destHost(u *url.URL) string {
	hosts := strings.Split(strings.ToLower(u.Host), ",")
	for i, h := range hosts {
		switch destScheme(u) {
		case "amqp":
			h = strings.TrimSuffix(strings.TrimSuffix(h, ":5672"), ":5671")
		case "kafka":
			h = strings.TrimSuffix(h, ":9092")
		case "awssqs":
			h = strings.TrimSuffix(h, ":443") // the queue URL is https://
		}
		hosts[i] = h
	}
	slices.Sort(hosts)
	return strings.Join(hosts, ",")
}
