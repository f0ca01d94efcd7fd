package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/kafka"
	"github.com/ackwise/ackwise/adapters/rabbitmq"
	"github.com/ackwise/ackwise/dlq"
)

func lagCmd(e env) *cobra.Command {
	var (
		window time.Duration
		asJSON bool
	)
	c := &cobra.Command{
		Use:   "lag <source-url> [--window 10s] [--json]",
		Short: "a consumer's backlog, how fast it drains and when it will be drained",
		Long: `lag samples the backlog of a consumer's source twice, --window apart, and prints
it with the estimated time to drain it: backlog ÷ (consume rate − ingress rate), or
"never" when the consumers do not keep up.

On Kafka (kafka://…?group=G) it reads the group's committed offsets and the end
offsets of the topic and its retry topics (without joining the group: live
consumers do not rebalance), so ingress and consume rates are told apart. On
RabbitMQ it reads the queue's ready messages by a passive declare (consuming
nothing); on other brokers the source's own count (SQS: messages available, in
flight and delayed). A queue tells only its depth: its change over the window is
the net drain rate (consume − ingress), and the time to drain follows from it.`,
		Args: positional("<source-url>"),
		RunE: func(c *cobra.Command, args []string) error {
			if window <= 0 {
				return usageErr(c, "--window = %v: want a positive duration", window)
			}
			if err := checkURLs(c, e, args[0]); err != nil {
				return err
			}
			r, err := measureLag(c.Context(), args[0], window)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(e.stdout).Encode(r)
			}
			printLag(e.stdout, r, args[0])
			return nil
		},
	}
	c.Flags().DurationVar(&window, "window", 10*time.Second, "time between the two samples")
	c.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	return c
}

// lagSample is one reading of a source's backlog.
type lagSample struct {
	at      time.Time
	backlog int64
	// On a log: the sums over partitions of the end offsets and of where
	// the group resumes (committed offset plus records settled above it).
	end, done  int64
	partitions []kafka.PartitionOffsets
}

// lagReport is what lag prints (--json as is).
type lagReport struct {
	// Log: Kafka offsets were read (ingress and consume rates are known).
	Log           bool    `json:"log"`
	WindowSeconds float64 `json:"window_seconds"`
	BacklogStart  int64   `json:"backlog_start"`
	Backlog       int64   `json:"backlog"`
	// IngressRate and ConsumeRate are messages a second, on a log only.
	IngressRate *float64 `json:"ingress_rate,omitempty"`
	ConsumeRate *float64 `json:"consume_rate,omitempty"`
	// DrainRate is how fast the backlog shrank, messages a second
	// (negative: it grew): consume − ingress.
	DrainRate float64 `json:"drain_rate"`
	// DrainSeconds is the estimated time to drain the backlog; nil when it
	// does not shrink ("never").
	DrainSeconds *float64                 `json:"drain_seconds"`
	Partitions   []partitionLag           `json:"partitions,omitempty"`
	partitions   []kafka.PartitionOffsets // for the text output
}

type partitionLag struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	End       int64  `json:"end"`
	Committed int64  `json:"committed"`
	Lag       int64  `json:"lag"`
}

// measureLag samples rawURL's backlog at the start and the end of window.
func measureLag(ctx context.Context, rawURL string, window time.Duration) (lagReport, error) {
	return lagAcross(ctx, rawURL, func(ctx context.Context) error {
		t := time.NewTimer(window)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	})
}

// lagAcross samples rawURL's backlog before and after wait.
func lagAcross(ctx context.Context, rawURL string, wait func(context.Context) error) (lagReport, error) {
	probe, closeProbe, err := lagProbe(ctx, rawURL)
	if err != nil {
		return lagReport{}, err
	}
	defer closeProbe()
	first, err := probe(ctx)
	if err != nil {
		return lagReport{}, err
	}
	if err := wait(ctx); err != nil {
		return lagReport{}, err
	}
	last, err := probe(ctx)
	if err != nil {
		return lagReport{}, err
	}
	return lagOf(first, last), nil
}

// lagOf computes the report from two samples.
func lagOf(first, last lagSample) lagReport {
	secs := last.at.Sub(first.at).Seconds()
	r := lagReport{Log: last.partitions != nil, WindowSeconds: secs, BacklogStart: first.backlog, Backlog: last.backlog, partitions: last.partitions}
	if r.Log {
		in := float64(last.end-first.end) / secs
		out := float64(last.done-first.done) / secs
		r.IngressRate, r.ConsumeRate = &in, &out
		r.DrainRate = out - in
		for _, p := range last.partitions {
			r.Partitions = append(r.Partitions, partitionLag{Topic: p.Topic, Partition: p.Partition, End: p.End, Committed: p.Committed, Lag: p.Lag()})
		}
	} else {
		r.DrainRate = float64(first.backlog-last.backlog) / secs
	}
	switch {
	case r.Backlog == 0:
		zero := 0.0
		r.DrainSeconds = &zero
	case r.DrainRate > 0:
		d := float64(r.Backlog) / r.DrainRate
		r.DrainSeconds = &d
	}
	return r
}

func printLag(w io.Writer, r lagReport, rawURL string) {
	fmt.Fprintf(w, "source: %s\n", redact(rawURL))
	fmt.Fprintf(w, "window: %v\n", time.Duration(r.WindowSeconds*float64(time.Second)).Round(time.Millisecond))
	if r.Log {
		fmt.Fprintf(w, "backlog: %d records (was %d): end offsets less the group's committed offsets\n", r.Backlog, r.BacklogStart)
		fmt.Fprintf(w, "ingress: %.1f msg/s (end offsets)\n", *r.IngressRate)
		fmt.Fprintf(w, "consume: %.1f msg/s (committed offsets)\n", *r.ConsumeRate)
	} else {
		fmt.Fprintf(w, "depth: %d messages (was %d), the broker's count\n", r.Backlog, r.BacklogStart)
		fmt.Fprintf(w, "net drain: %.1f msg/s (consume − ingress, from the change of the depth; negative: it grows)\n", r.DrainRate)
	}
	switch {
	case r.Backlog == 0:
		fmt.Fprintln(w, "time to drain: 0s (nothing waits)")
	case r.DrainSeconds == nil:
		fmt.Fprintln(w, "time to drain: never (the consumers do not keep up: consume rate ≤ ingress rate)")
	default:
		fmt.Fprintf(w, "time to drain: %v (backlog ÷ (consume rate − ingress rate))\n", time.Duration(math.Min(*r.DrainSeconds, float64(math.MaxInt64/2))*float64(time.Second)).Round(time.Second))
	}
	if len(r.partitions) > 0 {
		fmt.Fprintln(w, "partitions:")
		for _, p := range r.partitions {
			fmt.Fprintf(w, "  %s/%d end=%d committed=%d lag=%d\n", p.Topic, p.Partition, p.End, p.Committed, p.Lag())
		}
	}
}

// lagProbe returns a function that samples rawURL's backlog without
// consuming from it, and a function that closes what it opened.
func lagProbe(ctx context.Context, rawURL string) (func(context.Context) (lagSample, error), func(), error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, nil, errors.New("malformed URL (not shown: it may hold credentials; percent-encode special characters in the user name and password)")
	}
	switch strings.ToLower(u.Scheme) {
	case "kafka":
		// Not a Source: opening one joins the group, and the live
		// consumers would rebalance.
		cfg, err := kafka.ParseURL(u)
		if err != nil {
			return nil, nil, fmt.Errorf("lag: %w", err)
		}
		if cfg.Group == "" {
			return nil, nil, fmt.Errorf("lag of %s: the URL has no group= parameter: the consumer group whose lag to measure", redact(rawURL))
		}
		return func(ctx context.Context) (lagSample, error) {
			offs, err := kafka.GroupOffsets(ctx, cfg)
			if err != nil {
				return lagSample{}, fmt.Errorf("lag of %s: %w", redact(rawURL), err)
			}
			s := lagSample{at: time.Now(), partitions: offs}
			for _, o := range offs {
				s.backlog += o.Lag()
				s.end += o.End
				s.done += o.Committed + o.Settled
			}
			return s, nil
		}, func() {}, nil
	case "amqp", "amqps", "rabbit":
		// Not a Source: a source consumes, taking up to prefetch messages
		// from the live consumers for as long as it runs.
		cfg, err := rabbitmq.ConfigFromURL(u)
		if err != nil {
			return nil, nil, fmt.Errorf("lag: %w", err)
		}
		return func(ctx context.Context) (lagSample, error) {
			n, err := rabbitmq.QueueDepth(ctx, cfg)
			if err != nil {
				return lagSample{}, fmt.Errorf("lag of %s: %w", redact(rawURL), err)
			}
			return lagSample{at: time.Now(), backlog: int64(n)}, nil
		}, func() {}, nil
	}
	src, err := adapters.OpenSource(ctx, rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("open source: %w", err)
	}
	b, ok := src.(dlq.Backlogger)
	if !ok {
		_ = src.Close()
		return nil, nil, fmt.Errorf("lag of %s: the source cannot tell its backlog (it does not implement dlq.Backlogger)", redact(rawURL))
	}
	return func(ctx context.Context) (lagSample, error) {
		n, err := b.Backlog(ctx)
		if err != nil {
			return lagSample{}, fmt.Errorf("lag of %s: %w", redact(rawURL), err)
		}
		return lagSample{at: time.Now(), backlog: int64(n)}, nil
	}, func() { _ = src.Close() }, nil
}
