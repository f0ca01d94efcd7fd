package ackwise

import "context"

// Handler handles one message. Returning nil means the message's effect is
// done and the message may be acknowledged; an error is classified (see
// [ClassOf]) to decide between retry, dead letter and discard.
//
// Handle may be called concurrently from many goroutines, for different
// messages. The engine cancels ctx when the consumer shuts down past its drain
// deadline or when a timeout middleware fires.
type Handler interface {
	Handle(ctx context.Context, msg *Message) error
}

// HandlerFunc adapts an ordinary function to a [Handler].
type HandlerFunc func(ctx context.Context, msg *Message) error

// Handle calls f(ctx, msg).
func (f HandlerFunc) Handle(ctx context.Context, msg *Message) error { return f(ctx, msg) }

// Middleware wraps a Handler with behaviour of its own.
type Middleware func(Handler) Handler

// Chain wraps h in the middleware mw, the first one outermost: Chain(h, a, b)
// runs a, then b, then h.
func Chain(h Handler, mw ...Middleware) Handler {
	for i := len(mw) - 1; i >= 0; i-- {
		if mw[i] != nil {
			h = mw[i](h)
		}
	}
	return h
}
