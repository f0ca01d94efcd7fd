package middleware

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/ackwise/ackwise"
)

// IdempotencyKeyPrefix starts every key [IdempotencyKey] returns.
const IdempotencyKeyPrefix = "ackwise-"

// IdempotencyKey returns a stable idempotency key for one external call a
// handler makes, to pass to a payment, e-mail or other API that deduplicates
// by key (Stripe's Idempotency-Key header and the like). It is derived from
// the consumer name, the message's event ID ([ackwise.Message.EventID]) and step, a name for
// the call within the handler ("charge", "receipt-email"), so that:
//
//   - every redelivery and retry of the event yields the same key, and the API
//     performs the call once;
//   - two calls of one handler (two steps) and two consumers handling the same
//     event get different keys.
//
// The key is "ackwise-" and 32 lowercase hex digits (128 bits of SHA-256 of
// the length-prefixed parts): 40 ASCII characters, safe in headers and within
// every common API's length limit. It returns "" when msg has no event ID,
// because a key shared by every such message would make the API drop real
// calls; callers must treat "" as "no key available".
//
// Under an [Inbox] with a custom [InboxConfig].KeyFunc, use
// [InboxIdempotencyKey] instead: it derives the key from the event ID the
// inbox claimed, which this function cannot see.
func IdempotencyKey(msg *ackwise.Message, consumer, step string) string {
	return idempotencyKey(consumer, msg.EventID(), step)
}

// InboxIdempotencyKey is [IdempotencyKey] for a handler run by an [Inbox]:
// the key is derived from the inbox's consumer name, the event ID the inbox
// claimed for the message (what [InboxConfig].KeyFunc returned, when set) and
// step. ctx is the handler's. It returns "" when ctx does not come from an
// inbox that claimed an event (no inbox, or a message without a key let
// through by AllowMissingKey), and under a [BatchInbox], whose context
// serves a whole batch: use [IdempotencyKey] per message there.
func InboxIdempotencyKey(ctx context.Context, step string) string {
	k, ok := ctx.Value(inboxKeyCtx{}).(InboxKey)
	if !ok {
		return ""
	}
	return idempotencyKey(k.Consumer, k.EventID, step)
}

// inboxKeyCtx is the context key under which Inbox passes its claimed key
// to the handler.
type inboxKeyCtx struct{}

func idempotencyKey(consumer, id, step string) string {
	if id == "" {
		return ""
	}
	h := sha256.New()
	var n [8]byte
	for _, part := range [...]string{consumer, id, step} {
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	sum := h.Sum(nil)
	return IdempotencyKeyPrefix + hex.EncodeToString(sum[:16])
}
