package kafka

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestLostWaitsForCommitInFlight: the committer reads the settled offsets
// under the source's lock, then sends them without it. If the partitions
// are lost in between and franz-go rejoins the group before the commit is
// sent, the commit goes out under the new generation, is accepted, and sets
// the offsets of partitions another member owns by now back to older ones
// (their records are handled again). onLost now waits for a commit in
// flight, so it is sent before franz-go rejoins (after onLost returns).
// Here onLost is called directly while the commit is held between reading
// its offsets and sending them.
func TestLostWaitsForCommitInFlight(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	cfg.CommitInterval = 10 * time.Millisecond
	publishN(t, openSink(t, cfg), 5, func(i int) string { return "k" + strconv.Itoa(i) })
	src := openSource(t, cfg)
	committing, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	src.testCommitting = func() {
		once.Do(func() {
			close(committing)
			<-proceed
		})
	}
	ctx := context.Background()
	for _, m := range receiveN(t, src, 5) {
		if err := src.Ack(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-committing:
	case <-time.After(10 * time.Second):
		close(proceed)
		t.Fatal("no commit after the acks")
	}
	lost := make(chan struct{})
	go func() {
		src.onLost(ctx, src.Client(), map[string][]int32{cfg.Topic: {0}})
		close(lost)
	}()
	// No event marks onLost waiting: give it a window to return early.
	select {
	case <-lost:
		close(proceed)
		t.Fatal("onLost returned while a commit that read the lost partition's offsets was still to be sent")
	case <-time.After(300 * time.Millisecond):
	}
	close(proceed)
	select {
	case <-lost:
	case <-time.After(15 * time.Second):
		t.Fatal("onLost did not return after the commit in flight was sent")
	}
}

// TestLostTellsWithoutLocks: onLost calls the OnInvalid hook after the
// records of the lost partition stopped being Valid, without holding the
// source's locks (adapters.Invalidator): before, it held commitMu.
func TestLostTellsWithoutLocks(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	publishN(t, openSink(t, cfg), 1, func(i int) string { return "k" + strconv.Itoa(i) })
	src := openSource(t, cfg)
	m := receiveN(t, src, 1)[0]
	told := make(chan string, 1)
	src.OnInvalid(func() {
		switch {
		case src.Valid(m):
			told <- "told while the record is still Valid"
		case !src.commitMu.TryLock():
			told <- "told with commitMu held"
		case !src.rewindMu.TryLock():
			src.commitMu.Unlock()
			told <- "told with rewindMu held"
		default:
			src.rewindMu.Unlock()
			src.commitMu.Unlock()
			told <- ""
		}
	})
	src.onLost(context.Background(), src.Client(), map[string][]int32{cfg.Topic: {0}})
	select {
	case msg := <-told:
		if msg != "" {
			t.Fatal(msg)
		}
	default:
		t.Fatal("onLost did not tell")
	}
}
