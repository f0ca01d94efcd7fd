package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// statsOut is what stats prints with -json. Depth is the broker's count;
// every other count is of the sample (Messages received).
type statsOut struct {
	// Depth is what the dead-letter destination holds by the broker's
	// count (dlq.Backlogger), nil when the source cannot tell.
	Depth *int `json:"depth"`
	// Messages is the sample's size.
	Messages int `json:"messages"`
	// SampleCutShort: the sample holds fewer messages than the depth and
	// -n allow (the broker stopped delivering: RabbitMQ's prefetch; SQS's
	// messages in flight, counted in the depth).
	SampleCutShort   bool           `json:"sample_cut_short"`
	DeadLetters      int            `json:"dead_letters"`
	NoEnvelope       int            `json:"no_envelope"`
	DistinctEventIDs int            `json:"distinct_event_ids"`
	Copies           int            `json:"copies"`
	NoEventID        int            `json:"no_event_id"`
	ByReason         map[string]int `json:"by_reason"`
	ByErrorClass     map[string]int `json:"by_error_class"`
	BySource         map[string]int `json:"by_source"`
	OldestFirst      *time.Time     `json:"oldest_first_failure,omitempty"`
	OldestLast       *time.Time     `json:"oldest_last_failure,omitempty"`
	NewestLast       *time.Time     `json:"newest_last_failure,omitempty"`
	// OldestAgeSeconds is how long ago the oldest dead letter of the
	// sample was written (its last failure), where known.
	OldestAgeSeconds *float64 `json:"oldest_age_seconds,omitempty"`
	// BrokerOldestAgeSeconds is the age of the oldest dead letter the
	// destination holds by the broker (dlq.Ager: Kafka, the oldest record
	// the group has not read), 0 when it holds none; nil when the source
	// cannot tell (then the sample's OldestAgeSeconds is all there is).
	BrokerOldestAgeSeconds *float64 `json:"broker_oldest_age_seconds"`
	// BrokerOldest is when that dead letter was written (its envelope's
	// last failure, else its broker timestamp), when there is one.
	BrokerOldest *time.Time `json:"broker_oldest,omitempty"`
	Stop         string     `json:"stop"`
}

// oldestTimeout bounds the call to the broker for the oldest dead letter
// (dlq.Ager): Kafka's waits for a record from every partition with a
// backlog, which a transaction left open above the committed offset holds
// back until it ends.
const oldestTimeout = 30 * time.Second

func statsCmd(e env) *cobra.Command {
	var a sampleArgs
	c := &cobra.Command{
		Use:   "stats <source-url> [-n 1000] [--json] [--idle 2s]",
		Short: "depth by the broker, counts by reason, error class and source; consumes nothing",
		Args:  positional("<source-url>"),
		RunE: func(c *cobra.Command, args []string) error {
			if err := a.check(c, e, args); err != nil {
				return err
			}
			return stats(c.Context(), e.stdout, a)
		},
	}
	sampleFlags(c, &a, 1000, "print one JSON object")
	return c
}

func stats(ctx context.Context, stdout io.Writer, a sampleArgs) error {
	var (
		depth  = -1
		res    dlq.InspectResult
		oldest *time.Time // of the broker (dlq.Ager); zero: it holds none
	)
	err := withSource(ctx, a.url, func(src adapters.Source) error {
		// The depth first: a RabbitMQ source counts only until it has
		// received (see rabbitmq.Source.Backlog).
		if b, ok := src.(dlq.Backlogger); ok {
			n, err := b.Backlog(ctx)
			if err != nil {
				return fmt.Errorf("depth of %s: %w", redact(a.url), err)
			}
			depth = n
		}
		if ag, ok := src.(dlq.Ager); ok {
			actx, cancel := context.WithTimeout(ctx, oldestTimeout)
			at, found, err := ag.Oldest(actx)
			cancel()
			if err != nil {
				return fmt.Errorf("oldest dead letter of %s: %w", redact(a.url), err)
			}
			if !found {
				at = time.Time{}
			}
			oldest = &at
		}
		var err error
		res, err = sampleFrom(ctx, src, a.url, a.n, a.idle)
		return err
	})
	if err != nil {
		return err
	}
	now := time.Now()
	s := summarize(res, depth, a.n, now)
	if oldest != nil {
		age := 0.0
		if !oldest.IsZero() {
			age = max(now.Sub(*oldest), 0).Seconds()
			s.BrokerOldest = oldest
		}
		s.BrokerOldestAgeSeconds = &age
	}
	if a.asJSON {
		return json.NewEncoder(stdout).Encode(s)
	}
	printStats(stdout, s, res.Stop, a)
	return nil
}

// summarize counts the sample res of a destination holding depth messages
// (-1: unknown), taken with -n n, at now.
func summarize(res dlq.InspectResult, depth, n int, now time.Time) statsOut {
	s := statsOut{Messages: len(res.Letters), ByReason: map[string]int{}, ByErrorClass: map[string]int{}, BySource: map[string]int{}, Stop: string(res.Stop)}
	if depth >= 0 {
		s.Depth = &depth
		s.SampleCutShort = s.Messages < min(depth, n)
	}
	ids := map[string]struct{}{}
	for _, l := range res.Letters {
		if id := l.Message.EventID(); id != "" {
			ids[id] = struct{}{}
		} else {
			s.NoEventID++
		}
		if l.Err != nil {
			s.NoEnvelope++
			continue
		}
		e := l.Envelope
		s.DeadLetters++
		s.ByReason[cmp.Or(string(e.Reason), "-")]++
		s.ByErrorClass[cmp.Or(e.ErrorClass, "-")]++
		s.BySource[cmp.Or(e.Source, "-")]++
		s.OldestFirst = earliest(s.OldestFirst, e.FirstFailure)
		s.OldestLast = earliest(s.OldestLast, e.LastFailure)
		if f := e.LastFailure; !f.IsZero() && (s.NewestLast == nil || f.After(*s.NewestLast)) {
			s.NewestLast = &f
		}
	}
	s.DistinctEventIDs = len(ids)
	s.Copies = s.Messages - s.NoEventID - s.DistinctEventIDs
	if s.OldestLast != nil {
		age := now.Sub(*s.OldestLast).Seconds()
		s.OldestAgeSeconds = &age
	}
	return s
}

// seconds is secs as a duration, to the second.
func seconds(secs float64) time.Duration {
	return time.Duration(secs * float64(time.Second)).Round(time.Second)
}

// earliest returns the earlier of *p and t, ignoring nil and the zero time.
func earliest(p *time.Time, t time.Time) *time.Time {
	if t.IsZero() || (p != nil && !t.Before(*p)) {
		return p
	}
	return &t
}

func printStats(w io.Writer, s statsOut, stop dlq.StopReason, a sampleArgs) {
	if s.Depth != nil {
		fmt.Fprintf(w, "depth: %d (the broker's count)\n", *s.Depth)
	} else {
		fmt.Fprintln(w, "depth: unknown (the source cannot tell; the counts below are of the sample)")
	}
	fmt.Fprintf(w, "sample: %d messages (dead letters: %d, without envelope: %d)", s.Messages, s.DeadLetters, s.NoEnvelope)
	switch {
	case s.SampleCutShort:
		fmt.Fprintf(w, "; cut short: %d of %d, none came within --idle %v (RabbitMQ delivers no more than its prefetch, 128 unless the URL's ?prefetch= says more; SQS counts the messages in flight, which come back when their visibility timeout ends; else raise --idle)", s.Messages, min(*s.Depth, a.n), a.idle)
	case s.Depth != nil && s.Messages < *s.Depth:
		fmt.Fprintf(w, "; %d of %d (-n %d)", s.Messages, *s.Depth, a.n)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "event IDs: %d distinct (copies: %d", s.DistinctEventIDs, s.Copies)
	if s.NoEventID > 0 {
		fmt.Fprintf(w, ", %d without event ID", s.NoEventID)
	}
	fmt.Fprintln(w, "; dead-lettering is at least once: a copy is an event written again)")
	for _, g := range []struct {
		name   string
		counts map[string]int
	}{{"reason", s.ByReason}, {"error class", s.ByErrorClass}, {"source", s.BySource}} {
		fmt.Fprintf(w, "by %s:\n", g.name)
		for _, k := range byCount(g.counts) {
			fmt.Fprintf(w, "  %-24s %d\n", field(k), g.counts[k])
		}
	}
	switch {
	case s.BrokerOldest != nil:
		fmt.Fprintf(w, "oldest age: %v (the broker's: the oldest dead letter not yet read, written %s)\n", seconds(*s.BrokerOldestAgeSeconds), s.BrokerOldest.UTC().Format(time.RFC3339))
	case s.BrokerOldestAgeSeconds != nil:
		fmt.Fprintln(w, "oldest age: none (the broker's: no dead letter left to read)")
	case s.OldestLast != nil:
		fmt.Fprintf(w, "oldest dead letter: written %s (age %v, of the sample)\n", s.OldestLast.UTC().Format(time.RFC3339), seconds(*s.OldestAgeSeconds))
	}
	if s.OldestFirst != nil {
		fmt.Fprintf(w, "oldest first failure: %s\n", s.OldestFirst.UTC().Format(time.RFC3339))
	}
	if s.NewestLast != nil {
		fmt.Fprintf(w, "newest last failure: %s\n", s.NewestLast.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(w, "stopped: %s\n", stopText(stop, a.n, -1, a.idle))
}
