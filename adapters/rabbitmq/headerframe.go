package rabbitmq

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A message's properties, its headers among them, travel in one content
// header frame, which AMQP does not split: it must fit in the frame_max the
// connection negotiated (131072 bytes on RabbitMQ by default), or the broker
// closes the whole connection (frame_too_large), taking every unconfirmed
// message of every caller with it, and a publish sent again on the next
// connection closes that one too. So every publish is measured first (see
// headerFrameSize): a Sink message that does not fit fails alone with
// ErrHeadersTooLarge before anything is sent; a copy the source moves (a
// wait-queue hop, a dead letter), whose headers grew by the move's own,
// loses its largest headers instead, named in HeaderTrimmed.

// ErrHeadersTooLarge is returned (wrapped, marked ackwise.Permanent) for a
// message whose properties and headers do not fit in one AMQP frame of the
// connection's negotiated frame_max: the broker would close the connection
// on it. The message is not sent.
var ErrHeadersTooLarge = errors.New("rabbitmq: message headers do not fit in one frame")

// HeaderTrimmed lists, as a JSON array of strings, the headers the adapter
// removed from a copy it moved (a wait-queue hop, a dead letter) so that
// its headers fit in one frame; the payload is unchanged. A list too long
// for 1 KiB ends with an element "…and N more". Names of an earlier trim
// come first.
const HeaderTrimmed = "ackwise-trimmed-headers"

// maxTrimmedList bounds the JSON of HeaderTrimmed.
const maxTrimmedList = 1024

// headerFrameSize returns the size of the content header frame amqp091-go
// writes for p (write.go, headerFrame.write), frame overhead included, or
// why amqp091-go cannot write it: a short string over 255 bytes, a header
// value of a type AMQP has no encoding for.
func headerFrameSize(p *amqp.Publishing) (int, error) {
	n := frameOverhead + 2 + 2 + 8 + 2 // class-id, weight, body size, property flags
	for _, s := range []struct{ name, v string }{
		{"content-type", p.ContentType}, {"content-encoding", p.ContentEncoding},
		{"correlation-id", p.CorrelationId}, {"reply-to", p.ReplyTo},
		{"expiration", p.Expiration}, {"message-id", p.MessageId},
		{"type", p.Type}, {"user-id", p.UserId}, {"app-id", p.AppId},
	} {
		if s.v == "" {
			continue
		}
		if len(s.v) > 255 {
			return 0, fmt.Errorf("rabbitmq: %s is %d bytes; an AMQP short string holds at most 255", s.name, len(s.v))
		}
		n += 1 + len(s.v)
	}
	if len(p.Headers) > 0 {
		t, err := tableSize(p.Headers)
		if err != nil {
			return 0, err
		}
		n += t
	}
	if p.DeliveryMode > 0 {
		n++
	}
	if p.Priority > 0 {
		n++
	}
	if !p.Timestamp.IsZero() {
		n += 8
	}
	return n, nil
}

// tableSize returns the encoded size of t: its length and entries.
func tableSize(t amqp.Table) (int, error) {
	n := 4
	for k, v := range t {
		e, err := entrySize(k, v)
		if err != nil {
			return 0, err
		}
		n += e
	}
	return n, nil
}

// entrySize returns the encoded size of the table entry k = v.
func entrySize(k string, v any) (int, error) {
	if len(k) > 255 {
		return 0, fmt.Errorf("rabbitmq: header name of %d bytes; an AMQP short string holds at most 255", len(k))
	}
	f, err := fieldSize(v)
	if err != nil {
		return 0, fmt.Errorf("rabbitmq: header %q: %w", k, err)
	}
	return 1 + len(k) + f, nil
}

// fieldSize returns the encoded size of the field value v, its type octet
// included, as amqp091-go's writeField encodes it.
func fieldSize(v any) (int, error) {
	switch x := v.(type) {
	case nil:
		return 1, nil
	case bool, byte, int8:
		return 2, nil
	case int16, uint16:
		return 3, nil
	case int, int32, uint32, float32:
		return 5, nil
	case int64, float64, time.Time:
		return 9, nil
	case amqp.Decimal:
		return 6, nil
	case string:
		return 5 + len(x), nil
	case []byte:
		return 5 + len(x), nil
	case []any:
		n := 5
		for _, e := range x {
			f, err := fieldSize(e)
			if err != nil {
				return 0, err
			}
			n += f
		}
		return n, nil
	case amqp.Table:
		t, err := tableSize(x)
		return 1 + t, err
	}
	return 0, fmt.Errorf("value of type %T has no AMQP encoding", v)
}

// trimToFit removes headers from p until its content header frame fits in
// frameMax bytes: the largest first, those keep reports true for only when
// nothing else is left, and names them in HeaderTrimmed (after the names
// of an earlier trim). p.Headers is replaced, not changed. It returns the
// names removed, or an error wrapping ErrHeadersTooLarge when even no
// headers would not fit.
func trimToFit(p *amqp.Publishing, frameMax int, keep func(string) bool) ([]string, error) {
	size, err := headerFrameSize(p)
	if err != nil {
		return nil, err
	}
	if frameMax <= 0 || size <= frameMax {
		return nil, nil
	}
	bare := *p
	bare.Headers = nil
	base, _ := headerFrameSize(&bare) // measured above, with the headers
	h := maps.Clone(p.Headers)
	var earlier []string
	if v, ok := h[HeaderTrimmed]; ok {
		if s, ok := scalarString(v); ok {
			_ = json.Unmarshal([]byte(s), &earlier) // a list of ours, or none
		}
		delete(h, HeaderTrimmed)
	}
	type entry struct {
		key  string
		size int
		kept bool
	}
	entries := make([]entry, 0, len(h))
	sum := 0
	for k, v := range h {
		e, _ := entrySize(k, v) // measured above
		entries = append(entries, entry{k, e, keep != nil && keep(k)})
		sum += e
	}
	slices.SortFunc(entries, func(a, b entry) int {
		if a.kept != b.kept {
			if a.kept {
				return 1
			}
			return -1
		}
		return cmp.Or(cmp.Compare(b.size, a.size), cmp.Compare(a.key, b.key))
	})
	names := earlier
	var marker string
	fits := func() bool {
		marker = trimmedList(names)
		return base+4+sum+1+len(HeaderTrimmed)+5+len(marker) <= frameMax
	}
	for _, e := range entries {
		if len(names) > len(earlier) && fits() {
			break
		}
		delete(h, e.key)
		sum -= e.size
		names = append(names, e.key)
	}
	if !fits() {
		return nil, fmt.Errorf("%w: the content header frame is %d bytes without any header, frame_max %d", ErrHeadersTooLarge, base, frameMax)
	}
	h[HeaderTrimmed] = marker
	p.Headers = h
	return names[len(earlier):], nil
}

// trimmedList encodes names as HeaderTrimmed's JSON array, at most
// maxTrimmedList bytes: the names that fit, then "…and N more".
func trimmedList(names []string) string {
	if names == nil {
		names = []string{}
	}
	all, _ := json.Marshal(names) // strings: cannot fail
	if len(all) <= maxTrimmedList {
		return string(all)
	}
	const reserve = len(`,"…and 99999999 more"]`)
	out := []byte{'['}
	i := 0
	for ; i < len(names); i++ {
		q, _ := json.Marshal(names[i])
		if len(out)+1+len(q)+reserve > maxTrimmedList {
			break
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, q...)
	}
	r, _ := json.Marshal("…and " + strconv.Itoa(len(names)-i) + " more")
	if i > 0 {
		out = append(out, ',')
	}
	out = append(out, r...)
	return string(append(out, ']'))
}
