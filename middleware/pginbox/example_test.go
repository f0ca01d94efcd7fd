package pginbox_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/pginbox"
)

// A billing consumer whose balance update commits with its inbox record, and
// a retention job that forgets records after 17 days (SQS's 14-day maximum
// retention plus a 3-day replay margin).
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	store, err := pginbox.New(pool, pginbox.Config{Table: "billing.inbox", VersionTable: "billing.versions"})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	go store.PruneEvery(ctx, time.Hour, 17*24*time.Hour, func(err error) { log.Print(err) }) //nolint:errcheck

	inbox, err := middleware.Inbox(store, middleware.InboxConfig{Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	handler := inbox(ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
		_, err := pginbox.Tx(ctx).Exec(ctx, `UPDATE billing.accounts SET balance = balance + 10 WHERE id = $1`, msg.Key)
		return err
	}))
	_ = handler // pass to the consumer engine (consumer.Config.Inbox takes the middleware itself)
}

// A ledger writer that handles messages in batches: the inbox claims the
// batch's event IDs with one INSERT, and the handler writes every
// message's ledger row with one more, both in the inbox's transaction.
// The consumer engine's batch mode calls the handler; here it is called
// directly with two messages.
func Example_batch() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	store, err := pginbox.New(pool, pginbox.Config{Table: "ledger.inbox", VersionTable: "ledger.versions"})
	if err != nil {
		log.Fatal(err)
	}
	inbox, err := middleware.BatchInbox(store, middleware.InboxConfig{Consumer: "ledger"})
	if err != nil {
		log.Fatal(err)
	}
	handler := inbox(ackwise.BatchHandlerFunc(func(ctx context.Context, msgs []*ackwise.Message) error {
		ids := make([]string, len(msgs))
		accounts := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i], accounts[i] = m.ID, m.Key
		}
		_, err := pginbox.Tx(ctx).Exec(ctx,
			`INSERT INTO ledger.entries (event_id, account, amount) SELECT e, a, 10 FROM unnest($1::text[], $2::text[]) AS u(e, a)`,
			ids, accounts)
		return err // nil commits every row and inbox record; an error rolls them all back
	}))
	err = handler.HandleBatch(ctx, []*ackwise.Message{{ID: "ev-1", Key: "acct-1"}, {ID: "ev-2", Key: "acct-2"}})
	errs := make([]error, 2)
	ackwise.BatchOutcomes(err, errs) // one outcome per message, as the engine reads them
	for i, err := range errs {
		if err != nil {
			log.Printf("message %d: %v", i, err)
		}
	}
}
