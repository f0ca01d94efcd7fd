package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/ackwise/ackwise"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// CreateTopics creates every topic of cfg's chain (see [SourceConfig.Topics]) with
// the given partitions and replication factor (-1: the broker's default),
// leaving topics that exist alone. Retry and dead-letter topics get the same
// partition count as the topic (the existing topic's, when it exists), so
// that a retried record keeps its key's partition.
//
// Of cfg, the ClientConfig and the topics are used: Group and the fields
// about consuming are not, and may be left empty.
func CreateTopics(ctx context.Context, cfg SourceConfig, partitions int32, replicationFactor int16) error {
	cfg = cfg.withDefaults()
	if err := cfg.ClientConfig.validate(fieldsOf("SourceConfig"), cfg.Topic); err != nil {
		return err
	}
	if err := cfg.validateChain(fieldsOf("SourceConfig")); err != nil { // or it would create topics named after bad tiers
		return err
	}
	// cfg.Options too: they may carry the dialer or the authentication.
	cl, err := kgo.NewClient(append(cfg.ClientConfig.opts(), cfg.Options...)...)
	if err != nil {
		return fmt.Errorf("kafka: new client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	// A topic that exists already sets the count for the others.
	existing, err := adm.ListTopics(ctx, cfg.Topic)
	if err != nil {
		return fmt.Errorf("kafka: describe topic %s: %w", cfg.Topic, err)
	}
	if d, ok := existing[cfg.Topic]; ok && d.Err == nil && len(d.Partitions) > 0 {
		partitions = int32(len(d.Partitions))
	}
	resp, err := adm.CreateTopics(ctx, partitions, replicationFactor, nil, cfg.Topics()...)
	if err != nil {
		return fmt.Errorf("kafka: create topics: %w", err)
	}
	var errs []error
	for _, r := range resp.Sorted() {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			errs = append(errs, fmt.Errorf("kafka: create topic %s: %w", r.Topic, r.Err))
		}
	}
	return errors.Join(errs...)
}

// missingTopics returns which of topics do not exist.
func missingTopics(ctx context.Context, cl *kgo.Client, topics []string) ([]string, error) {
	if len(topics) == 0 {
		return nil, nil
	}
	det, err := kadm.NewClient(cl).ListTopics(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("kafka: describe topics %v: %w", topics, err)
	}
	var missing []string
	for _, t := range topics {
		d, ok := det[t]
		switch {
		case !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition):
			missing = append(missing, t)
		case d.Err != nil:
			return nil, fmt.Errorf("kafka: describe topic %s: %w", t, d.Err)
		}
	}
	return missing, nil
}

// writes are the topics a source writes to: its retry moves and dead
// letters.
type writes struct {
	group, deadLetter string
	retries           []string
	limits            *batchLimits // of the retry and dead-letter topics, read by newClient
}

// newClient is the package's newClient for a source of group that writes to
// w: once a broker answered, it checks that the topics exist
// (checkWriteTopics) and reads their batch limits.
func (w writes) newClient(ctx context.Context, cfg string, c ClientConfig, opts []kgo.Opt, check func(*kgo.Client) error) (*kgo.Client, error) {
	cl, err := newClient(ctx, c.optionsName(cfg), c.Brokers, opts, check)
	if err != nil {
		return nil, err
	}
	if err := checkWriteTopics(ctx, cl, c.Logger, w.group, w.deadLetter, w.retries); err != nil {
		cl.Close()
		return nil, err
	}
	w.limits.read(ctx, cl, append(slices.Clip(w.retries), w.deadLetter)...)
	return cl, nil
}

// checkWriteTopics checks the topics a source writes to. Missing retry topics
// are an error: every retry move would fail, and the engine would try it
// again in place for ever, the record's key held. A missing dead-letter topic
// is only logged (at Error), and so is a failure to look it up (at Warn): a
// source that never dead-letters (the CLI reading a dead-letter topic) has
// none, and may not be allowed to describe it; every dead letter to it fails
// loudly.
func checkWriteTopics(ctx context.Context, cl *kgo.Client, log *slog.Logger, group, deadLetterTopic string, retryTopics []string) error {
	missing, err := missingTopics(ctx, cl, retryTopics)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return fmt.Errorf("kafka: retry topics %v do not exist: every retry move to them would fail and the record come back at the same attempt; create them first (kafka.CreateTopics creates the whole chain)", missing)
	}
	switch dead, err := missingTopics(ctx, cl, []string{deadLetterTopic}); {
	case err != nil:
		log.Warn("kafka: cannot check that the dead-letter topic exists", ackwise.LogKeyTopic, deadLetterTopic, ackwise.LogKeyGroup, group, ackwise.LogKeyError, err)
	case len(dead) > 0:
		log.Error("kafka: the dead-letter topic does not exist: every dead letter will fail, and its record come back; create it (kafka.CreateTopics creates the whole chain)",
			ackwise.LogKeyTopic, deadLetterTopic, ackwise.LogKeyGroup, group)
	}
	return nil
}
