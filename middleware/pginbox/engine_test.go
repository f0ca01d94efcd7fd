package pginbox_test

import (
	"context"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware/inboxtest"
	"github.com/ackwise/ackwise/middleware/pginbox"
)

// TestEngineAppliesEachEventOnceUnderFaults runs inboxtest.RunEngine: the
// engine on the memory broker with every settle and dead-letter fault, and a
// handler that writes its effect row through the inbox's transaction before
// failing on some events.
func TestEngineAppliesEachEventOnceUnderFaults(t *testing.T) {
	eachMode(t, func(t *testing.T, mode func(*pginbox.Config)) {
		inboxtest.RunEngine(t, engineOf(setup(t, mode)))
	})
}

// TestBatchEngineAppliesEachEventOnceUnderFaults is the same with a batch
// handler under BatchInbox (inboxtest.RunEngineBatch).
func TestBatchEngineAppliesEachEventOnceUnderFaults(t *testing.T) {
	inboxtest.RunEngineBatch(t, engineOf(setup(t)))
}

// engineOf is the inboxtest.Engine of b's store, writing an effect row
// through the inbox's transaction.
func engineOf(b *testBundle) inboxtest.Engine {
	return inboxtest.Engine{
		Store:   b.store,
		Handled: b.store.Handled,
		Apply: func(ctx context.Context, msg *ackwise.Message) error {
			_, err := pginbox.Tx(ctx).Exec(ctx, `INSERT INTO `+b.schema+`.effects (event_id, amount) VALUES ($1, 1)`, msg.ID)
			return err
		},
		Effects:       b.effects,
		Transactional: true,
	}
}
