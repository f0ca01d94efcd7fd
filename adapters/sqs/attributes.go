package sqs

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ackwise/ackwise"
)

// Message attributes the adapter sets and reads itself (docs/headers.md).
const (
	// AttrHeaders holds, as JSON, the headers that are not message
	// attributes of their own: those past SQS's 10 attributes a message, and
	// those no attribute can carry (a name SQS refuses, an empty value, a
	// repeated name). A JSON array of objects {"k": name, "v": value}, with
	// "kb" or "vb" (standard base64) instead of "k" or "v" for a name or
	// value that is not text SQS takes.
	AttrHeaders = "ackwise-headers"
	// AttrBodyEncoding says how the body holds a payload that is not text
	// SQS takes: "base64" (standard base64), or "empty" for an empty payload
	// (SQS refuses an empty body; the body is then a single space).
	AttrBodyEncoding = "ackwise-body-encoding"
)

// MaxAttributes is SQS's limit of message attributes per message.
const MaxAttributes = 10

const (
	encBase64 = "base64"
	encEmpty  = "empty"
)

// sqsText reports whether s is text SQS takes in a message body or a String
// attribute: valid UTF-8 of the characters #x9, #xA, #xD, #x20 to #xD7FF,
// #xE000 to #xFFFD and #x10000 to #x10FFFF.
func sqsText(s string) bool {
	for _, r := range s {
		switch {
		case r == utf8.RuneError:
			// Invalid UTF-8, or a literal U+FFFD (taken, but rare enough
			// that telling the two apart is not worth it: base64 is exact).
			return false
		case r == '\t' || r == '\n' || r == '\r':
		case r < 0x20, r >= 0xD800 && r < 0xE000, r == 0xFFFE, r == 0xFFFF:
			return false
		}
	}
	return true
}

// attrName reports whether SQS takes name as a message attribute name: up
// to 256 of A-Z, a-z, 0-9, '_', '-' and '.', not starting or ending with
// '.', without "..", not starting with "AWS." or "Amazon." in any case.
func attrName(name string) bool {
	if name == "" || len(name) > 256 || name[0] == '.' || name[len(name)-1] == '.' || strings.Contains(name, "..") {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	l := strings.ToLower(name)
	return !strings.HasPrefix(l, "aws.") && !strings.HasPrefix(l, "amazon.")
}

// encodeBody returns the SQS body of payload and its AttrBodyEncoding ("":
// the body is the payload).
func encodeBody(payload []byte) (body, enc string) {
	switch {
	case len(payload) == 0:
		return " ", encEmpty
	case utf8.Valid(payload) && sqsText(string(payload)):
		return string(payload), ""
	default:
		return base64.StdEncoding.EncodeToString(payload), encBase64
	}
}

// decodeBody is the payload of an SQS body with AttrBodyEncoding enc. A
// body that does not decode (a producer's forged encoding) is taken as it
// is.
func decodeBody(body, enc string) []byte {
	switch enc {
	case encEmpty:
		return []byte{}
	case encBase64:
		if b, err := base64.StdEncoding.DecodeString(body); err == nil {
			return b
		}
	}
	return []byte(body)
}

// packed is one header in AttrHeaders.
type packed struct {
	K  string `json:"k,omitempty"`
	KB []byte `json:"kb,omitempty"`
	V  string `json:"v,omitempty"`
	VB []byte `json:"vb,omitempty"`
}

func packOne(kv ackwise.Header) packed {
	var p packed
	if sqsText(kv.Key) {
		p.K = kv.Key
	} else {
		p.KB = []byte(kv.Key)
	}
	if sqsText(kv.Value) {
		p.V = kv.Value
	} else {
		p.VB = []byte(kv.Value)
	}
	return p
}

// first are the headers given attributes of their own before the others
// when not all fit: the key, the body's encoding, then these.
var first = []string{ackwise.HeaderEventID, ackwise.HeaderTraceparent}

// encodeAttributes returns the message attributes of a message with key
// and headers h (hop headers and an ackwise-key header left out: key is
// the Message.Key) and a body encoding enc. Each header is a String
// attribute, or a Binary one when its value is not text SQS takes; when
// they are more than MaxAttributes, or some cannot be attributes, the key,
// the body encoding, the event ID, traceparent and then the others in
// order take MaxAttributes-1 attributes and the rest go into AttrHeaders.
func encodeAttributes(key string, h ackwise.Headers, enc string) map[string]types.MessageAttributeValue {
	all := make(ackwise.Headers, 0, len(h)+2)
	if key != "" {
		all = append(all, ackwise.Header{Key: ackwise.HeaderKey, Value: key})
	}
	if enc != "" {
		all = append(all, ackwise.Header{Key: AttrBodyEncoding, Value: enc})
	}
	for _, name := range first {
		for _, kv := range h {
			if kv.Key == name {
				all = append(all, kv)
			}
		}
	}
	for _, kv := range h {
		if !slices.Contains(first, kv.Key) && kv.Key != ackwise.HeaderKey && kv.Key != AttrBodyEncoding && !ackwise.IsHopHeader(kv.Key) {
			all = append(all, kv)
		}
	}
	// Which headers can be attributes of their own: a repeated name only
	// the first time.
	ok := make([]bool, len(all))
	seen := make(map[string]bool, len(all))
	room := MaxAttributes
	for i, kv := range all {
		ok[i] = !seen[kv.Key] && kv.Value != "" && kv.Key != AttrHeaders && attrName(kv.Key)
		seen[kv.Key] = true
		if !ok[i] {
			room = MaxAttributes - 1
		}
	}
	if len(all) > MaxAttributes {
		room = MaxAttributes - 1
	}
	attrs := make(map[string]types.MessageAttributeValue, min(len(all), MaxAttributes))
	var rest []packed
	for i, kv := range all {
		if !ok[i] || len(attrs) >= room {
			rest = append(rest, packOne(kv))
			continue
		}
		attrs[kv.Key] = attrValue(kv.Value)
	}
	if len(rest) > 0 {
		var b bytes.Buffer
		e := json.NewEncoder(&b)
		e.SetEscapeHTML(false)
		_ = e.Encode(rest) // strings and byte slices: it cannot fail
		attrs[AttrHeaders] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(strings.TrimSuffix(b.String(), "\n"))}
	}
	return attrs
}

func attrValue(v string) types.MessageAttributeValue {
	if sqsText(v) {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	return types.MessageAttributeValue{DataType: aws.String("Binary"), BinaryValue: []byte(v)}
}

// decodeAttributes returns the headers of a message with attributes attrs
// (sorted by name, then those packed in AttrHeaders in their order), its
// key (ackwise-key, which stays among the headers too) and its body
// encoding (AttrBodyEncoding, which does not). A String or Number
// attribute's header value is its string, a Binary one's its bytes. An
// AttrHeaders that is not the adapter's JSON (a producer's) is an
// ordinary header.
func decodeAttributes(attrs map[string]types.MessageAttributeValue) (h ackwise.Headers, key, enc string) {
	names := make([]string, 0, len(attrs))
	for k := range attrs {
		names = append(names, k)
	}
	slices.Sort(names)
	h = make(ackwise.Headers, 0, len(attrs))
	var rest []packed
	for _, k := range names {
		a := attrs[k]
		v := aws.ToString(a.StringValue)
		if a.StringValue == nil && a.BinaryValue != nil {
			v = string(a.BinaryValue)
		}
		switch k {
		case AttrBodyEncoding:
			enc = v
			continue
		case AttrHeaders:
			if err := json.Unmarshal([]byte(v), &rest); err == nil {
				continue
			}
			rest = nil
		case ackwise.HeaderKey:
			key = v
		}
		h = append(h, ackwise.Header{Key: k, Value: v})
	}
	for _, p := range rest {
		kv := ackwise.Header{Key: p.K, Value: p.V}
		if p.KB != nil {
			kv.Key = string(p.KB)
		}
		if p.VB != nil {
			kv.Value = string(p.VB)
		}
		if kv.Key == ackwise.HeaderKey && key == "" {
			key = kv.Value
		}
		h = append(h, kv)
	}
	return h, key, enc
}
