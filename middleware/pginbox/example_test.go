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
