package dlq

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ackwise/ackwise"
)

// Header names of the envelope.
const (
	HeaderReason          = "ackwise-dlq-reason"
	HeaderError           = "ackwise-dlq-error"
	HeaderErrorClass      = "ackwise-dlq-error-class"
	HeaderSource          = "ackwise-dlq-source"
	HeaderPartition       = "ackwise-dlq-partition"
	HeaderOffset          = "ackwise-dlq-offset"
	HeaderMessageID       = "ackwise-dlq-message-id"
	HeaderAttempts        = "ackwise-dlq-attempts"
	HeaderFirstFailure    = "ackwise-dlq-first-failure"
	HeaderLastFailure     = "ackwise-dlq-last-failure"
	HeaderConsumer        = "ackwise-dlq-consumer"
	HeaderConsumerVersion = "ackwise-dlq-consumer-version"
)

// HeaderPrefix starts every envelope header.
const HeaderPrefix = "ackwise-dlq-"

// HeaderTrimmed marks a dead letter an adapter wrote trimmed because it did
// not fit its destination whole (a Kafka record near the dead-letter topic's
// max.message.bytes; docs/kafka.md): "value-bytes=N;value-kept=M;…", where N
// is the size of the whole payload and M the bytes of it kept (its first
// M). Like every envelope header, dead-lettering replaces a producer's.
const HeaderTrimmed = HeaderPrefix + "trimmed"

// PayloadCut reports whether h marks a dead letter whose payload was cut
// (HeaderTrimmed with value-kept below value-bytes). A marker that cannot be
// read counts as cut: only a payload known to be whole may be redriven.
func PayloadCut(h ackwise.Headers) bool {
	v, ok := h.Lookup(HeaderTrimmed)
	if !ok {
		return false
	}
	whole, kept := int64(-1), int64(-1)
	for _, f := range strings.Split(v, ";") {
		name, val, _ := strings.Cut(f, "=")
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			continue
		}
		switch name {
		case "value-bytes":
			whole = n
		case "value-kept":
			kept = n
		}
	}
	return whole < 0 || kept < 0 || kept < whole
}

// Reason says why a message was dead-lettered.
type Reason string

// Reasons. The engine writes ReasonPermanent (a permanent error or a
// panic) and ReasonMaxAttempts; ReasonExpired and ReasonUnroutable are for
// adapters and tools that give up on a message for those causes (a deadline
// passed, no route to its destination).
const (
	ReasonPermanent   Reason = "permanent"
	ReasonMaxAttempts Reason = "max-attempts"
	ReasonExpired     Reason = "expired"
	ReasonUnroutable  Reason = "unroutable"
)

// Reasons are the reasons ackwise writes, in the order above.
var Reasons = []Reason{ReasonPermanent, ReasonMaxAttempts, ReasonExpired, ReasonUnroutable}

// ParseReason returns the Reason named s, one of Reasons, or an error
// naming s and the known reasons (the ackwise CLI validates its -reason
// filter with it, so that a misspelt reason is an error, not a filter
// that matches nothing).
func ParseReason(s string) (Reason, error) {
	for _, r := range Reasons {
		if string(r) == s {
			return r, nil
		}
	}
	return "", fmt.Errorf("dlq: unknown reason %q (known: %s, %s, %s, %s)", s, ReasonPermanent, ReasonMaxAttempts, ReasonExpired, ReasonUnroutable)
}

// MaxErrorLen bounds the error text in bytes; longer text is cut at a rune
// boundary and ends in "…".
const MaxErrorLen = 1024

// Envelope is the context of one dead letter.
type Envelope struct {
	Reason Reason
	// Error is the handler's error text, at most MaxErrorLen bytes.
	Error string
	// ErrorClass is the classified class ("permanent", "transient", …).
	ErrorClass string
	// Source is the topic, queue or subscription the message came from.
	Source string
	// Partition and Offset locate the message on a log; -1 where there is
	// none.
	Partition int32
	Offset    int64
	// MessageID is the broker's own message ID.
	MessageID string
	// Attempts is the number of deliveries made before giving up.
	Attempts int
	// FirstFailure and LastFailure are when the first and last attempts
	// failed.
	FirstFailure time.Time
	LastFailure  time.Time
	// Consumer and ConsumerVersion name who gave up.
	Consumer        string
	ConsumerVersion string
}

// New builds the envelope for msg, which failed for the last time at now with
// err of class class.
func New(msg *ackwise.Message, reason Reason, err error, class ackwise.Class, now time.Time, consumer, version string) Envelope {
	first := msg.FirstFailure
	if first.IsZero() {
		first = now
	}
	text := ""
	if err != nil {
		// Through fmt, which recovers a panic in Error (a typed nil
		// *MyError the handler returned, wrapped by ackwise.Permanent):
		// called directly, that panic would crash the consumer on the
		// engine's goroutine, and again on every redelivery.
		text = fmt.Sprint(err)
	}
	return Envelope{
		Reason:          reason,
		Error:           BoundError(text),
		ErrorClass:      class.String(),
		Source:          msg.Source,
		Partition:       msg.Partition,
		Offset:          msg.Offset,
		MessageID:       msg.BrokerID,
		Attempts:        msg.Attempt,
		FirstFailure:    first,
		LastFailure:     now,
		Consumer:        consumer,
		ConsumerVersion: version,
	}
}

// BoundError cuts s to at most MaxErrorLen bytes at a rune boundary.
func BoundError(s string) string {
	if len(s) <= MaxErrorLen {
		return s
	}
	const ellipsis = "…"
	cut := MaxErrorLen - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// Encode writes the envelope's headers into h, replacing any earlier ones.
func (e Envelope) Encode(h *ackwise.Headers) {
	h.Set(HeaderReason, string(e.Reason))
	h.Set(HeaderError, BoundError(e.Error))
	h.Set(HeaderErrorClass, e.ErrorClass)
	h.Set(HeaderSource, e.Source)
	if e.Partition >= 0 {
		h.Set(HeaderPartition, strconv.FormatInt(int64(e.Partition), 10))
	}
	if e.Offset >= 0 {
		h.Set(HeaderOffset, strconv.FormatInt(e.Offset, 10))
	}
	if e.MessageID != "" {
		h.Set(HeaderMessageID, e.MessageID)
	}
	h.Set(HeaderAttempts, strconv.Itoa(e.Attempts))
	if !e.FirstFailure.IsZero() {
		h.Set(HeaderFirstFailure, e.FirstFailure.UTC().Format(time.RFC3339Nano))
	}
	if !e.LastFailure.IsZero() {
		h.Set(HeaderLastFailure, e.LastFailure.UTC().Format(time.RFC3339Nano))
	}
	h.Set(HeaderConsumer, e.Consumer)
	if e.ConsumerVersion != "" {
		h.Set(HeaderConsumerVersion, e.ConsumerVersion)
	}
}

// Apply returns a copy of headers with the envelope added. The message's
// own headers are kept but for credentials (see SecretHeaders); envelope
// headers from an earlier dead-lettering (a redriven message that failed
// again) are replaced.
func (e Envelope) Apply(headers ackwise.Headers) ackwise.Headers {
	out := withoutEnvelope(headers, 12)
	out = withoutSecrets(out)
	e.Encode(&out)
	return out
}

// SecretHeaders are the message headers Apply leaves out of a dead letter,
// compared without regard to case: credentials a producer put in headers
// must not be stored in a dead-letter destination, where every operator
// who inspects it would see them. A redriven message goes back without
// them.
var SecretHeaders = []string{
	"authorization", "proxy-authorization", "cookie", "set-cookie",
	"x-api-key", "x-auth-token", "x-amz-security-token",
}

// withoutSecrets removes the SecretHeaders from h, in place.
func withoutSecrets(h ackwise.Headers) ackwise.Headers {
	return slices.DeleteFunc(h, func(kv ackwise.Header) bool { return IsSecretHeader(kv.Key) })
}

// IsSecretHeader reports whether key is one of SecretHeaders.
func IsSecretHeader(key string) bool {
	for _, s := range SecretHeaders {
		if strings.EqualFold(key, s) {
			return true
		}
	}
	return false
}

// Decode reads the envelope from a dead letter's headers. It fails when the
// headers carry no envelope or a field does not parse.
func Decode(h ackwise.Headers) (Envelope, error) {
	reason, ok := h.Lookup(HeaderReason)
	if !ok {
		return Envelope{}, fmt.Errorf("dlq: no %s header: not a dead letter", HeaderReason)
	}
	e := Envelope{
		Reason:          Reason(reason),
		Error:           h.Get(HeaderError),
		ErrorClass:      h.Get(HeaderErrorClass),
		Source:          h.Get(HeaderSource),
		Partition:       -1,
		Offset:          -1,
		MessageID:       h.Get(HeaderMessageID),
		Consumer:        h.Get(HeaderConsumer),
		ConsumerVersion: h.Get(HeaderConsumerVersion),
	}
	if v, ok := h.Lookup(HeaderPartition); ok {
		p, err := strconv.ParseInt(v, 10, 32)
		if err != nil {
			return e, fmt.Errorf("dlq: %s = %q: %w", HeaderPartition, v, err)
		}
		e.Partition = int32(p)
	}
	if v, ok := h.Lookup(HeaderOffset); ok {
		o, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return e, fmt.Errorf("dlq: %s = %q: %w", HeaderOffset, v, err)
		}
		e.Offset = o
	}
	if v, ok := h.Lookup(HeaderAttempts); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			return e, fmt.Errorf("dlq: %s = %q: %w", HeaderAttempts, v, err)
		}
		e.Attempts = n
	}
	for name, dst := range map[string]*time.Time{HeaderFirstFailure: &e.FirstFailure, HeaderLastFailure: &e.LastFailure} {
		if v, ok := h.Lookup(name); ok {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return e, fmt.Errorf("dlq: %s = %q: %w", name, v, err)
			}
			*dst = t
		}
	}
	return e, nil
}

// Strip returns a copy of headers without the envelope, for redrive: the
// message goes back to its source as it was, its event ID included.
func Strip(headers ackwise.Headers) ackwise.Headers {
	return withoutEnvelope(headers, 0)
}

// withoutEnvelope copies headers without the envelope's, with room for
// extra more.
func withoutEnvelope(headers ackwise.Headers, extra int) ackwise.Headers {
	out := make(ackwise.Headers, 0, len(headers)+extra)
	for _, kv := range headers {
		if !strings.HasPrefix(kv.Key, HeaderPrefix) {
			out = append(out, kv)
		}
	}
	return out
}
