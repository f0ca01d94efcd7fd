package pginbox_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/internal/crashtest"
	"github.com/ackwise/ackwise/internal/pgtest"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/pginbox"
)

// The crash tests run a consumer in a child process (this test binary
// re-executed) and kill it with SIGKILL at a chosen point, then redeliver the
// message in the parent as the broker would, and count the effects.

const (
	crashEnvMode   = "ACKWISE_PGINBOX_CRASH_MODE"
	crashEnvSchema = "ACKWISE_PGINBOX_CRASH_SCHEMA"
	modeBeforeCmt  = "before-commit" // effect written, transaction open
	modeAfterCmt   = "after-commit"  // effect and record committed, not acked
	crashEnvOneRT  = "ACKWISE_PGINBOX_CRASH_ONE_ROUND_TRIP"
	markerReady    = "ACKWISE-CRASH-POINT"
)

// TestCrashChild is the child's body; it does nothing in a normal run.
func TestCrashChild(t *testing.T) {
	mode := os.Getenv(crashEnvMode)
	if mode == "" {
		return
	}
	schema := os.Getenv(crashEnvSchema)
	pool := pgtest.Connect(t, 2)
	store, err := pginbox.New(pool, pginbox.Config{Table: schema + ".inbox", VersionTable: schema + ".versions",
		OneRoundTripClaim: os.Getenv(crashEnvOneRT) != ""})
	if err != nil {
		t.Fatal(err)
	}
	h := inbox(t, store, "billing", ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
		if _, err := pginbox.Tx(ctx).Exec(ctx, `INSERT INTO "`+schema+`".effects (event_id, amount) VALUES ($1, 10)`, msg.ID); err != nil {
			return err
		}
		if mode == modeBeforeCmt {
			fmt.Println(markerReady)
			select {} // killed here, transaction open
		}
		return nil
	}))
	if err := h.Handle(context.Background(), msgFor("crash-ev")); err != nil {
		t.Fatal(err)
	}
	fmt.Println(markerReady)
	select {} // killed here: committed, never acked
}

func runCrashChild(t *testing.T, b *testBundle, mode string) {
	t.Helper()
	env := []string{crashEnvMode + "=" + mode, crashEnvSchema + "=" + strings.Trim(b.schema, `"`), "ACKWISE_TEST_POSTGRES=" + pgtest.URL()}
	if b.cfg.OneRoundTripClaim {
		env = append(env, crashEnvOneRT+"=1")
	}
	crashtest.KillAt(t, "TestCrashChild", markerReady, env...)
}

func TestCrashBeforeCommitAppliesOnceAfterRedelivery(t *testing.T) {
	eachMode(t, func(t *testing.T, mode func(*pginbox.Config)) {
		b := setup(t, mode)
		runCrashChild(t, b, modeBeforeCmt)
		// The child died with its transaction open; PostgreSQL rolls it back
		// when the connection drops (a redelivery that comes first waits on the
		// row lock until then).
		var runs atomic.Int32
		h := inbox(t, b.store, "billing", b.effectHandler(&runs, nil))
		if err := h.Handle(t.Context(), msgFor("crash-ev")); err != nil {
			t.Fatalf("redelivery: %v", err)
		}
		if err := h.Handle(t.Context(), msgFor("crash-ev")); err != nil {
			t.Fatalf("second redelivery: %v", err)
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("handler ran %d times on redelivery, want 1 (the crashed attempt left nothing)", n)
		}
		if n := b.effects(t, "crash-ev"); n != 1 {
			t.Fatalf("%d effect rows after crash and redelivery, want exactly 1", n)
		}
	})
}

func TestCrashBetweenCommitAndAckAppliesOnce(t *testing.T) {
	eachMode(t, func(t *testing.T, mode func(*pginbox.Config)) {
		b := setup(t, mode)
		runCrashChild(t, b, modeAfterCmt)
		if n := b.effects(t, "crash-ev"); n != 1 {
			t.Fatalf("child committed but %d effect rows exist, want 1", n)
		}
		var runs atomic.Int32
		h := inbox(t, b.store, "billing", b.effectHandler(&runs, nil))
		if err := h.Handle(t.Context(), msgFor("crash-ev")); err != nil {
			t.Fatalf("redelivery: %v (want nil: acknowledged as a duplicate)", err)
		}
		if n := runs.Load(); n != 0 {
			t.Fatalf("handler ran %d times on the redelivery of a committed event, want 0", n)
		}
		if n := b.effects(t, "crash-ev"); n != 1 {
			t.Fatalf("%d effect rows after crash and redelivery, want exactly 1", n)
		}
		if ok, err := b.store.Handled(t.Context(), middleware.InboxKey{Consumer: "billing", EventID: "crash-ev"}); !ok || err != nil {
			t.Fatalf("Handled = %v, %v; want true", ok, err)
		}
	})
}
