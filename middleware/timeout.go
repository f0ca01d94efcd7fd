package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ackwise/ackwise"
)

// ErrTimeout is wrapped by the error [Timeout] returns when the handler ran
// out of its time. Such a failure is transient (the message is retried)
// unless the handler's own error carries a class (ackwise.Permanent, say),
// which it keeps.
var ErrTimeout = errors.New("middleware: handler timed out")

// Timeout returns middleware that gives each handler call a context with a
// deadline d from its start. When the handler returns after the deadline
// passed with an error, and the caller's own context is still live, the
// error is wrapped with [ErrTimeout] (errors.Is finds both). A d of zero or
// less disables the timeout.
//
// Timeout is cooperative: it cancels the context but waits for the handler to
// return. It never abandons a running handler, because returning early would
// let a retry of the message run while the first attempt still has effects in
// flight (and, with the inbox, still holds its transaction). A handler that
// ignores its context keeps its worker; the engine's lease heartbeat keeps the
// message.
func Timeout(d time.Duration) ackwise.Middleware {
	return func(next ackwise.Handler) ackwise.Handler {
		if d <= 0 {
			return next
		}
		return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
			tctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			err := next.Handle(tctx, msg)
			if err != nil && ctx.Err() == nil && errors.Is(tctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("%w after %v: %w", ErrTimeout, d, err)
			}
			return err
		})
	}
}
