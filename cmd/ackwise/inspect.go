package main

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// sampleArgs are the arguments of the commands that sample a dead-letter
// source (inspect, ls, show, stats).
type sampleArgs struct {
	url    string
	n      int
	idle   time.Duration
	asJSON bool
}

// sampleFlags defines the flags of a command that samples a dead-letter
// source: -n N (default n), --idle, and --json when jsonHelp is not empty.
func sampleFlags(c *cobra.Command, a *sampleArgs, n int, jsonHelp string) {
	c.Flags().IntVarP(&a.n, "limit", "n", n, "receive at most `N` messages (all are released afterwards)")
	c.Flags().DurationVar(&a.idle, "idle", dlq.DefaultIdleTimeout, "stop when no message arrives for this `long`")
	if jsonHelp != "" {
		c.Flags().BoolVar(&a.asJSON, "json", false, jsonHelp)
	}
}

// check checks the flags of a and takes the source URL from args.
func (a *sampleArgs) check(c *cobra.Command, e env, args []string) error {
	if a.n < 1 || a.n > maxSample {
		return usageErr(c, "-n = %d: want 1 to %d", a.n, maxSample)
	}
	if a.idle <= 0 {
		return usageErr(c, "--idle = %v: want a positive duration", a.idle)
	}
	a.url = args[0]
	return checkURLs(c, e, a.url)
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

func inspectCmd(e env) *cobra.Command {
	var a sampleArgs
	c := &cobra.Command{
		Use:   "inspect <source-url> [-n 20] [--json] [--idle 2s]",
		Short: "print dead letters, one a line; consumes nothing",
		Args:  positional("<source-url>"),
		RunE: func(c *cobra.Command, args []string) error {
			if err := a.check(c, e, args); err != nil {
				return err
			}
			res, err := sample(c.Context(), a.url, a.n, a.idle)
			// Print what was seen even when the run ended with an error.
			enc := json.NewEncoder(e.stdout)
			for _, l := range res.Letters {
				if a.asJSON {
					if jerr := enc.Encode(letterJSON(l, false)); jerr != nil {
						return jerr
					}
					continue
				}
				fmt.Fprintln(e.stdout, letterLine(l))
			}
			return err
		},
	}
	sampleFlags(c, &a, dlq.DefaultInspectMax, "print one JSON object a line")
	return c
}

func lsCmd(e env) *cobra.Command {
	var a sampleArgs
	c := &cobra.Command{
		Use:   "ls <source-url> [-n 100] [--json] [--idle 2s]",
		Short: "list dead letters as a table (or JSON with headers); consumes nothing",
		Args:  positional("<source-url>"),
		RunE: func(c *cobra.Command, args []string) error {
			if err := a.check(c, e, args); err != nil {
				return err
			}
			res, err := sample(c.Context(), a.url, a.n, a.idle)
			if a.asJSON {
				enc := json.NewEncoder(e.stdout)
				for _, l := range res.Letters {
					if jerr := enc.Encode(letterJSON(l, true)); jerr != nil {
						return jerr
					}
				}
				return err
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "EVENT ID\tREASON\tCLASS\tSOURCE\tATTEMPTS\tLAST FAILURE\tSIZE")
			for _, l := range res.Letters {
				fmt.Fprintln(tw, strings.Join(letterRow(l), "\t"))
			}
			if ferr := tw.Flush(); ferr != nil {
				return ferr
			}
			return err
		},
	}
	sampleFlags(c, &a, 100, "print one JSON object a line, with the message's headers")
	return c
}

// letterRow is a dead letter's row in ls's table.
func letterRow(l dlq.Letter) []string {
	m, e := l.Message, l.Envelope
	size := strconv.Itoa(len(m.Payload))
	if l.Err != nil {
		return []string{field(m.EventID()), "(no envelope)", "-", "-", "-", "-", size}
	}
	last := "-"
	if !e.LastFailure.IsZero() {
		last = e.LastFailure.UTC().Format(time.RFC3339)
	}
	return []string{field(m.EventID()), field(string(e.Reason)), field(e.ErrorClass), field(e.Source), strconv.Itoa(e.Attempts), last, size}
}

func showCmd(e env) *cobra.Command {
	var (
		a       sampleArgs
		payload bool
	)
	c := &cobra.Command{
		Use:   "show <source-url> <event-id|offset> [--payload] [-n 1000] [--json]",
		Short: "print one dead letter: envelope, headers, payload on request; consumes nothing",
		Long: `show receives up to -n dead letters (releasing them all) and prints those whose
event ID is <event-id>, or, on a log, whose offset is <offset> ("<partition>:<offset>"
for one partition), or whose broker message ID is the argument: the envelope, the
headers (credential headers hidden) and, with --payload, the payload (as text when
it is printable UTF-8, else as a hex dump). Nothing found is an error (exit 1).`,
		Args: positional("<source-url>", "<event-id|offset>"),
		RunE: func(c *cobra.Command, args []string) error {
			if err := a.check(c, e, args); err != nil {
				return err
			}
			res, err := sample(c.Context(), a.url, a.n, a.idle)
			if err != nil {
				return err
			}
			found := 0
			enc := json.NewEncoder(e.stdout)
			for _, l := range res.Letters {
				if !selects(l.Message, args[1]) {
					continue
				}
				found++
				if a.asJSON {
					o := letterJSON(l, true)
					if payload {
						o.Payload = l.Message.Payload
					}
					if jerr := enc.Encode(o); jerr != nil {
						return jerr
					}
					continue
				}
				if found > 1 {
					fmt.Fprintln(e.stdout)
				}
				printLetter(e.stdout, l, payload)
			}
			if found == 0 {
				return fmt.Errorf("no dead letter with event ID, offset or message ID %s among the %d received from %s (-n %d; on RabbitMQ at most its prefetch, see ?prefetch=)", field(args[1]), len(res.Letters), redact(a.url), a.n)
			}
			return nil
		},
	}
	sampleFlags(c, &a, 1000, "print one JSON object a line, with the headers (and the payload, base64, with --payload)")
	c.Flags().BoolVar(&payload, "payload", false, "print the payload too (it may hold personal data): text when printable UTF-8, else a hex dump")
	return c
}

// selects reports whether m is the dead letter sel names: its event ID,
// its offset on a log ("<offset>" or "<partition>:<offset>") or its broker
// message ID.
func selects(m *ackwise.Message, sel string) bool {
	if m.EventID() == sel || m.BrokerID == sel {
		return true
	}
	if m.Offset < 0 {
		return false
	}
	part, off, hasPart := strings.Cut(sel, ":")
	if !hasPart {
		part, off = "", sel
	}
	o, err := strconv.ParseInt(off, 10, 64)
	if err != nil || o != m.Offset {
		return false
	}
	if !hasPart {
		return true
	}
	p, err := strconv.ParseInt(part, 10, 32)
	return err == nil && int32(p) == m.Partition
}

// printLetter prints one dead letter for show.
func printLetter(w io.Writer, l dlq.Letter, payload bool) {
	m, e := l.Message, l.Envelope
	fmt.Fprintf(w, "event ID:      %s\n", field(m.EventID()))
	fmt.Fprintf(w, "message ID:    %s\n", field(m.BrokerID))
	if m.Key != "" {
		fmt.Fprintf(w, "key:           %s\n", field(m.Key))
	}
	if m.Offset >= 0 {
		fmt.Fprintf(w, "at:            partition %d, offset %d\n", m.Partition, m.Offset)
	}
	if l.Err != nil {
		fmt.Fprintf(w, "envelope:      none (%v)\n", l.Err)
	} else {
		fmt.Fprintln(w, "envelope:")
		tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
		row := func(k, v string) {
			if v != "" {
				fmt.Fprintf(tw, "  %s:\t%s\n", k, v)
			}
		}
		row("reason", string(e.Reason))
		row("error class", e.ErrorClass)
		row("error", strconv.Quote(e.Error))
		row("source", e.Source)
		if e.Partition >= 0 {
			row("partition", strconv.Itoa(int(e.Partition)))
		}
		if e.Offset >= 0 {
			row("offset", strconv.FormatInt(e.Offset, 10))
		}
		row("message ID", e.MessageID)
		row("attempts", strconv.Itoa(e.Attempts))
		row("first failure", timeText(e.FirstFailure))
		row("last failure", timeText(e.LastFailure))
		row("consumer", e.Consumer)
		row("consumer version", e.ConsumerVersion)
		_ = tw.Flush()
	}
	fmt.Fprintln(w, "headers:")
	for _, h := range visibleHeaders(m.Headers) {
		fmt.Fprintf(w, "  %s: %s\n", field(h.Key), field(h.Value))
	}
	fmt.Fprintf(w, "payload:       %d bytes", len(m.Payload))
	if !payload {
		fmt.Fprintln(w, " (--payload prints it)")
		return
	}
	if printable(m.Payload) {
		fmt.Fprintln(w, ", text:")
		fmt.Fprintln(w, string(m.Payload))
		return
	}
	fmt.Fprintln(w, ", binary, hex dump:")
	fmt.Fprint(w, hex.Dump(m.Payload))
}

func timeText(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// printable reports whether b is UTF-8 text a terminal shows as it is:
// no control characters but newlines and tabs (an escape sequence in a
// payload must not drive the operator's terminal).
func printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if r != '\n' && r != '\t' && r != '\r' && !unicode.IsPrint(r) && !unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

// headerOut is a message header as ls --json and show print it.
type headerOut struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// visibleHeaders are h with the values of credential headers
// (dlq.SecretHeaders), which a dead letter written by an older release or
// another tool may still carry, hidden.
func visibleHeaders(h ackwise.Headers) []headerOut {
	out := make([]headerOut, 0, len(h))
	for _, kv := range h {
		v := kv.Value
		if dlq.IsSecretHeader(kv.Key) {
			v = "(hidden: a credential)"
		}
		out = append(out, headerOut{Key: kv.Key, Value: v})
	}
	return out
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
	EventID         string      `json:"event_id"`
	Key             string      `json:"key,omitempty"`
	BrokerID        string      `json:"broker_id,omitempty"`
	DeadLetter      bool        `json:"dead_letter"`
	EnvelopeError   string      `json:"envelope_error,omitempty"`
	Reason          string      `json:"reason,omitempty"`
	ErrorClass      string      `json:"error_class,omitempty"`
	Error           string      `json:"error,omitempty"`
	Source          string      `json:"source,omitempty"`
	Partition       *int32      `json:"partition,omitempty"`
	Offset          *int64      `json:"offset,omitempty"`
	MessageID       string      `json:"message_id,omitempty"`
	Attempts        int         `json:"attempts,omitempty"`
	RedriveCount    string      `json:"redrive_count,omitempty"`
	FirstFailure    *time.Time  `json:"first_failure,omitempty"`
	LastFailure     *time.Time  `json:"last_failure,omitempty"`
	Consumer        string      `json:"consumer,omitempty"`
	ConsumerVersion string      `json:"consumer_version,omitempty"`
	PayloadBytes    int         `json:"payload_bytes"`
	Headers         []headerOut `json:"headers,omitempty"`
	Payload         []byte      `json:"payload,omitempty"`
}

// letterJSON is l as inspect, ls and show print it with --json; headers
// adds the message's headers (credentials hidden).
func letterJSON(l dlq.Letter, headers bool) letterOut {
	m, e := l.Message, l.Envelope
	o := letterOut{
		EventID:      m.EventID(),
		Key:          m.Key,
		BrokerID:     m.BrokerID,
		PayloadBytes: len(m.Payload),
	}
	if headers {
		o.Headers = visibleHeaders(m.Headers)
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

// stopText explains s; n is the run's -n or --max, backlog what the source
// held at the start (dlq.RedriveResult.Backlog).
func stopText(s dlq.StopReason, n, backlog int, idle time.Duration) string {
	switch s {
	case dlq.StopIdle:
		return fmt.Sprintf("idle (no message within %v: drained, or the broker holds back more deliveries)", idle)
	case dlq.StopMax:
		return fmt.Sprintf("max (%d reached; there may be more)", n)
	case dlq.StopHeldLimit:
		return "held-limit (too many messages held unsettled; narrow the filter or raise --max-held)"
	case dlq.StopRepeat:
		return "repeat (a held message came back: every message was seen)"
	case dlq.StopBacklog:
		return fmt.Sprintf("backlog (received the %d messages the destination held at the start; dead letters that came back since are left for a later run)", backlog)
	case dlq.StopMovedLimit:
		return fmt.Sprintf("moved-limit (%d events moved, the most one run remembers; run again for the rest)", dlq.MaxMovedIDs)
	}
	return string(s)
}
