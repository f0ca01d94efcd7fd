package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// CreateTopics creates every topic of cfg's chain (see [Config.Topics]) with
// the given partitions and replication factor (-1: the broker's default),
// leaving topics that exist alone. Retry and dead-letter topics get the same
// partition count as the topic (the existing topic's, when it exists), so
// that a retried record keeps its key's partition.
func CreateTopics(ctx context.Context, cfg Config, partitions int32, replicationFactor int16) error {
	cfg = cfg.withDefaults()
	if err := cfg.validate(false); err != nil {
		return err
	}
	if err := cfg.validateChain(); err != nil { // or it would create topics named after bad tiers
		return err
	}
	// cfg.Options too: they may carry the dialer or the authentication.
	cl, err := kgo.NewClient(append(cfg.clientOpts(), cfg.Options...)...)
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
