package middleware

import (
	"context"
	"fmt"
	"time"
)

// PruneEvery is the retention job behind the stores' PruneEvery methods: it
// calls prune(ctx, olderThan) at once and then every interval until ctx is
// done, and returns ctx's error. A failed run is passed to onError (nil
// ignores it) and does not stop the job. An interval of zero or less, or a
// negative olderThan — every run would fail, a job that never prunes — is an
// error returned at once.
func PruneEvery(ctx context.Context, interval, olderThan time.Duration, prune func(context.Context, time.Duration) (int64, error), onError func(error)) error {
	if interval <= 0 {
		return fmt.Errorf("PruneEvery interval %v must be positive", interval)
	}
	if olderThan < 0 {
		return fmt.Errorf("PruneEvery olderThan %v is negative", olderThan)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := prune(ctx, olderThan); err != nil && ctx.Err() == nil && onError != nil {
			onError(err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// PruneInBatches calls deleteBatch until it deletes fewer than batch
// records, and returns how many it deleted in all: the loop behind the SQL
// stores' Prune methods, which delete at most batch rows per statement so
// that each transaction and its locks stay short. An error ends the loop
// and is returned with the total deleted before it.
func PruneInBatches(batch int64, deleteBatch func() (int64, error)) (int64, error) {
	var total int64
	for {
		n, err := deleteBatch()
		if err != nil {
			return total, err
		}
		total += n
		if n < batch {
			return total, nil
		}
	}
}
