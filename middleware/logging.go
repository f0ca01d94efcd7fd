package middleware

import (
	"context"
	"log/slog"
	"time"

	"github.com/ackwise/ackwise"
)

// Logging returns middleware that writes one record per handler call to
// logger: "message handled" at Debug on success, "message failed" on
// failure with the error and its class, at Error for permanent failures and
// Warn for the others (the engine decides what happens next and may log
// again). Payloads are never logged. The attribute keys are the
// ackwise.LogKey constants: source, event ID, broker ID, attempt,
// duration, key, and on failure class and error. A nil logger disables the middleware.
//
// Logging is safe for concurrent use if logger is, which every
// *slog.Logger is.
func Logging(logger *slog.Logger) ackwise.Middleware {
	return func(next ackwise.Handler) ackwise.Handler {
		if logger == nil {
			return next
		}
		return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
			start := time.Now()
			err := next.Handle(ctx, msg)
			level := slog.LevelDebug
			text := "message handled"
			var class ackwise.Class
			if err != nil {
				class = ackwise.ClassOf(err)
				text = "message failed"
				level = slog.LevelWarn
				if class == ackwise.ClassPermanent {
					level = slog.LevelError
				}
			}
			if !logger.Enabled(ctx, level) {
				return err
			}
			attrs := make([]slog.Attr, 0, 8)
			attrs = append(attrs,
				slog.String(ackwise.LogKeySource, msg.Source),
				slog.String(ackwise.LogKeyEventID, msg.EventID()),
				slog.String(ackwise.LogKeyBrokerID, msg.BrokerID),
				slog.Int(ackwise.LogKeyAttempt, msg.Attempt),
				slog.Duration(ackwise.LogKeyDuration, time.Since(start)),
			)
			if msg.Key != "" {
				attrs = append(attrs, slog.String(ackwise.LogKeyKey, msg.Key))
			}
			if err != nil {
				attrs = append(attrs, slog.String(ackwise.LogKeyClass, class.String()), slog.String(ackwise.LogKeyError, err.Error()))
			}
			logger.LogAttrs(ctx, level, text, attrs...)
			return err
		})
	}
}
