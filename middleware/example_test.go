package middleware_test

import (
	"context"
	"fmt"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/meminbox"
)

func ExampleInbox() {
	store := meminbox.New(nil) // pginbox or sqliteinbox in a real service
	inbox, err := middleware.Inbox(store, middleware.InboxConfig{Consumer: "billing"})
	if err != nil {
		panic(err)
	}
	balance := 0
	h := inbox(ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
		balance += 10 // with pginbox: pginbox.Tx(ctx).Exec(ctx, "UPDATE …")
		return nil
	}))
	topUp := &ackwise.Message{ID: "topup-1"}
	_ = h.Handle(context.Background(), topUp)
	_ = h.Handle(context.Background(), topUp) // the broker delivers it again
	_ = h.Handle(context.Background(), &ackwise.Message{ID: "topup-2"})
	fmt.Println(balance)
	// Output: 20
}

func ExampleIdempotencyKey() {
	msg := &ackwise.Message{ID: "order-42-paid"}
	key := middleware.IdempotencyKey(msg, "billing", "charge")
	fmt.Println(key == middleware.IdempotencyKey(msg, "billing", "charge"), len(key))
	// Output: true 40
}
