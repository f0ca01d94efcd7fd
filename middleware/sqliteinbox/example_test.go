package sqliteinbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/sqliteinbox"
)

func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "sqliteinbox-example")
	defer os.RemoveAll(dir)

	db, err := sqliteinbox.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	store, err := sqliteinbox.New(db, sqliteinbox.Config{})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	if _, err := db.Exec(`CREATE TABLE balances (account TEXT PRIMARY KEY, amount INTEGER NOT NULL)`); err != nil {
		panic(err)
	}
	inbox, err := middleware.Inbox(store, middleware.InboxConfig{Consumer: "billing"})
	if err != nil {
		panic(err)
	}
	h := inbox(ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
		// The effect goes through the inbox's transaction: it commits with
		// the inbox record or not at all.
		_, err := sqliteinbox.Tx(ctx).ExecContext(ctx,
			`INSERT INTO balances (account, amount) VALUES (?, 10)
			 ON CONFLICT (account) DO UPDATE SET amount = amount + 10`, msg.Key)
		return err
	}))

	topUp := &ackwise.Message{ID: "topup-1", Key: "acct-7"}
	for range 3 { // the broker delivers the same event three times
		if err := h.Handle(ctx, topUp); err != nil {
			panic(err)
		}
	}
	var amount int
	_ = db.QueryRow(`SELECT amount FROM balances WHERE account = 'acct-7'`).Scan(&amount)
	fmt.Println(amount)
	// Output: 10
}
