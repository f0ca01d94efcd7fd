package middleware

import (
	"context"
	"log/slog"
	"time"

	"github.com/ackwise/ackwise"
)

// Attribute keys of the records [Logging] writes.
const (
	LogKeySource   = "source"
	LogKeyEventID  = "event_id"
	LogKeyBrokerID = "broker_id"
	LogKeyKey      = "key"
	LogKeyAttempt  = "attempt"
	LogKeyDuration = "duration"
	LogKeyClass    = "class"
	LogKeyError    = "error"
)

// Logging returns middleware that writes one record per handler call to
// logger: "message handled" at Debug on success, "message failed" on
// failure with the error and its class, at Error for permanent failures and
// Warn for the others (the engine decides what happens next and may log
// again). Payloads are never logged. A nil logger disables the middleware.
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
				slog.String(LogKeySource, msg.Source),
				slog.String(LogKeyEventID, msg.EventID()),
				slog.String(LogKeyBrokerID, msg.BrokerID),
				slog.Int(LogKeyAttempt, msg.Attempt),
				slog.Duration(LogKeyDuration, time.Since(start)),
			)
			if msg.Key != "" {
				attrs = append(attrs, slog.String(LogKeyKey, msg.Key))
			}
			if err != nil {
				attrs = append(attrs, slog.String(LogKeyClass, class.String()), slog.String(LogKeyError, err.Error()))
			}
			logger.LogAttrs(ctx, level, text, attrs...)
			return err
		})
	}
}
