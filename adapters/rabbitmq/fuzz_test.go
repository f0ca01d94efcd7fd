package rabbitmq

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/internal/urlparam"
	"github.com/ackwise/ackwise/dlq"
)

// The header fuzz targets build an AMQP table from the fuzz input with a
// small decoder: the input is a stream of tags, each a value of one of the
// types amqp091-go decodes a field table into, nested up to fuzzDepth.
// Strings are mostly taken from fuzzWords (header names, x-death fields and
// queue names of the topology the targets use), so that the fuzzer reaches
// well-formed histories and near misses, not only noise.

const fuzzDepth = 5

// fuzzWaitQueues is the topology of the fuzz targets: work queue "q" with
// two tiers.
var fuzzWaitQueues = []string{"q.wait.1s", "q.wait.10s"}

var fuzzWords = []string{
	"", headerDeath, ackwise.HeaderAttempt, headerDeliveryCount, "queue", "reason", "exchange", "count",
	"routing-keys", "time", "original-expiration", "expired", "rejected", "q", "q.wait.1s", "q.wait.10s",
	"q.wait.7s", "q.wait.1", "1", "2", "0", "-1", "+3", "1048576", "1048577", "1000000000",
	"9223372036854775807", "x-first-death-queue", "x-last-death-reason", headerCC, headerBCC,
	ackwise.HeaderEventID, ackwise.HeaderFirstFailure, anonIDPrefix + "1", "s", "x", "ev-1",
	"2026-01-02T03:04:05Z", "Authorization", dlq.HeaderReason,
}

// Tags of the fuzz table encoding.
const (
	tagNil = iota
	tagString
	tagBytes
	tagBool
	tagInt8
	tagInt16
	tagInt32
	tagSmallInt64 // one byte, sign-extended: small counts are easy to reach
	tagInt64
	tagUint8
	tagUint16
	tagUint32
	tagUint64
	tagFloat32
	tagFloat64
	tagTime
	tagDecimal
	tagArray
	tagTable
	numTags
)

type fuzzReader struct{ b []byte }

func (r *fuzzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fuzzReader) n(n int) []byte {
	out := make([]byte, n)
	copy(out, r.b)
	r.b = r.b[min(n, len(r.b)):]
	return out
}

func (r *fuzzReader) str() string {
	n := int(r.byte())
	if n < len(fuzzWords) {
		return fuzzWords[n]
	}
	return string(r.n((n - len(fuzzWords)) % 64))
}

func (r *fuzzReader) value(depth int) any {
	switch r.byte() % numTags {
	case tagString:
		return r.str()
	case tagBytes:
		return []byte(r.str())
	case tagBool:
		return r.byte()&1 == 1
	case tagInt8:
		return int8(r.byte())
	case tagInt16:
		return int16(binary.BigEndian.Uint16(r.n(2)))
	case tagInt32:
		return int32(binary.BigEndian.Uint32(r.n(4)))
	case tagSmallInt64:
		return int64(int8(r.byte()))
	case tagInt64:
		return int64(binary.BigEndian.Uint64(r.n(8)))
	case tagUint8:
		return r.byte()
	case tagUint16:
		return binary.BigEndian.Uint16(r.n(2))
	case tagUint32:
		return binary.BigEndian.Uint32(r.n(4))
	case tagUint64:
		return binary.BigEndian.Uint64(r.n(8))
	case tagFloat32:
		return math.Float32frombits(binary.BigEndian.Uint32(r.n(4)))
	case tagFloat64:
		return math.Float64frombits(binary.BigEndian.Uint64(r.n(8)))
	case tagTime:
		return time.Unix(int64(binary.BigEndian.Uint32(r.n(4))), 0)
	case tagDecimal:
		return amqp.Decimal{Scale: r.byte(), Value: int32(binary.BigEndian.Uint32(r.n(4)))}
	case tagArray:
		if depth >= fuzzDepth {
			return nil
		}
		a := make([]any, int(r.byte()%6))
		for i := range a {
			a[i] = r.value(depth + 1)
		}
		return a
	case tagTable:
		if depth >= fuzzDepth {
			return nil
		}
		return r.table(depth + 1)
	}
	return nil
}

func (r *fuzzReader) table(depth int) amqp.Table {
	t := amqp.Table{}
	for range int(r.byte() % 10) {
		k := r.str()
		t[k] = r.value(depth)
	}
	return t
}

// fuzzTable decodes data into a header table.
func fuzzTable(data []byte) amqp.Table {
	r := &fuzzReader{b: data}
	return r.table(0)
}

// encodeFuzzTable is fuzzTable's inverse for the values it can produce:
// it writes the seed corpus.
func encodeFuzzTable(t amqp.Table) []byte {
	var b []byte
	str := func(s string) {
		if i := slices.Index(fuzzWords, s); i >= 0 {
			b = append(b, byte(i))
			return
		}
		if len(s) >= 64 || len(fuzzWords)+len(s) > 255 {
			panic("seed string too long: " + s)
		}
		b = append(b, byte(len(fuzzWords)+len(s)))
		b = append(b, s...)
	}
	var value func(v any)
	table := func(t amqp.Table) {
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, byte(len(keys)))
		for _, k := range keys {
			str(k)
			value(t[k])
		}
	}
	value = func(v any) {
		switch x := v.(type) {
		case nil:
			b = append(b, tagNil)
		case string:
			b = append(b, tagString)
			str(x)
		case []byte:
			b = append(b, tagBytes)
			str(string(x))
		case bool:
			b = append(b, tagBool)
			if x {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		case int8:
			b = append(b, tagInt8, byte(x))
		case int16:
			b = binary.BigEndian.AppendUint16(append(b, tagInt16), uint16(x))
		case int32:
			b = binary.BigEndian.AppendUint32(append(b, tagInt32), uint32(x))
		case int64:
			if x >= math.MinInt8 && x <= math.MaxInt8 {
				b = append(b, tagSmallInt64, byte(x))
			} else {
				b = binary.BigEndian.AppendUint64(append(b, tagInt64), uint64(x))
			}
		case uint8:
			b = append(b, tagUint8, x)
		case uint16:
			b = binary.BigEndian.AppendUint16(append(b, tagUint16), x)
		case uint32:
			b = binary.BigEndian.AppendUint32(append(b, tagUint32), x)
		case uint64:
			b = binary.BigEndian.AppendUint64(append(b, tagUint64), x)
		case float32:
			b = binary.BigEndian.AppendUint32(append(b, tagFloat32), math.Float32bits(x))
		case float64:
			b = binary.BigEndian.AppendUint64(append(b, tagFloat64), math.Float64bits(x))
		case time.Time:
			b = binary.BigEndian.AppendUint32(append(b, tagTime), uint32(x.Unix()))
		case amqp.Decimal:
			b = binary.BigEndian.AppendUint32(append(b, tagDecimal, x.Scale), uint32(x.Value))
		case []any:
			b = append(b, tagArray, byte(len(x)))
			for _, e := range x {
				value(e)
			}
		case amqp.Table:
			b = append(b, tagTable)
			table(x)
		default:
			panic(fmt.Sprintf("seed value of type %T", v))
		}
	}
	table(t)
	return b
}

// fuzzHeaderSeeds are the header tables the seed corpora start from:
// honest returns, and the forgeries of issue 17.
func fuzzHeaderSeeds() []amqp.Table {
	ret := func(q string, count int64) amqp.Table {
		return wellFormedDeath(q, "expired", count)
	}
	return []amqp.Table{
		{},
		{ackwise.HeaderEventID: "ev-1", "x-tenant": "acme"},
		{headerDeath: []any{ret("q.wait.1s", 1)}, ackwise.HeaderAttempt: "2", ackwise.HeaderFirstFailure: "2026-01-02T03:04:05Z", "x-first-death-queue": "q.wait.1s"},
		{headerDeath: []any{ret("q.wait.10s", 2), ret("q.wait.1s", 3)}, ackwise.HeaderAttempt: "7", headerDeliveryCount: int64(2)},
		{headerDeath: []any{"s"}},
		{headerDeath: []any{with(ret("q.wait.1s", 1), "count", "x")}},
		{ackwise.HeaderAttempt: "1000000000", headerDeliveryCount: int64(1000000000)},
		{ackwise.HeaderAttempt: int64(math.MaxInt64)},
		{headerDeath: []any{ret("q.wait.1s", math.MaxInt64)}, ackwise.HeaderAttempt: "9223372036854775807"},
		{headerDeath: []any{ret("q", 1000000000)}},
		{headerDeath: []any{ret("q.wait.1s", 1), ret("q.wait.1s", 1)}},
		{headerDeath: []any{ret("q.wait.1s", 1)}, ackwise.HeaderEventID: int32(7), headerCC: []any{"q"}, "Authorization": "s"},
	}
}

// TestFuzzTableRoundTrip: the seed encoder and the fuzz decoder agree, so
// the seed corpora hold what they say.
func TestFuzzTableRoundTrip(t *testing.T) {
	t.Parallel()
	for i, s := range fuzzHeaderSeeds() {
		if got := fuzzTable(encodeFuzzTable(s)); !reflect.DeepEqual(got, s) {
			t.Errorf("seed %d: decoded %#v, want %#v", i, got, s)
		}
	}
}

// FuzzAttemptOf: for any header table, attemptOf does not panic and gives
// an attempt in [1, maxAttempt]; a delivery that is not a return counts 1,
// plus its redelivery; a return has a well-formed history whose newest
// entry names a wait queue. The copies made of it (wait hop, dead letter)
// carry an x-death only on a return, only the well-formed one it came
// with, never x-delivery-count, CC or BCC, and the hop headers the source
// set.
func FuzzAttemptOf(f *testing.F) {
	for _, s := range fuzzHeaderSeeds() {
		b := encodeFuzzTable(s)
		f.Add(b, false, false, false)
		f.Add(b, true, true, false)
		f.Add(b, true, false, true)
	}
	f.Fuzz(func(t *testing.T, data []byte, redelivered, quorum, plain bool) {
		tbl := fuzzTable(data)
		wait := fuzzWaitQueues
		if plain {
			wait = nil
		}
		attempt, isReturn := attemptOf(tbl, redelivered, quorum, wait)
		if attempt < 1 || attempt > maxAttempt {
			t.Fatalf("attempt %d out of [1, %d]", attempt, maxAttempt)
		}
		deaths, wellFormed := readDeaths(tbl[headerDeath])
		switch {
		case isReturn && (!wellFormed || deaths[0].reason != "expired" || !slices.Contains(wait, deaths[0].queue)):
			t.Fatalf("read as a return: x-death %#v", tbl[headerDeath])
		case !isReturn && !redelivered && attempt != 1:
			t.Fatalf("first delivery counted attempt %d", attempt)
		case !isReturn && redelivered && !quorum && attempt != 2:
			t.Fatalf("classic redelivery of a first delivery counted attempt %d", attempt)
		}
		msg := &ackwise.Message{Headers: fromTable(tbl), Attempt: attempt}
		env := dlq.New(msg, dlq.ReasonMaxAttempts, errors.New("boom"), ackwise.ClassTransient, time.Unix(1700000000, 0), "c", "v")
		for name, out := range map[string]amqp.Table{
			"wait hop":    moveTable(tbl, hopHeaders(msg, attempt+1), "", isReturn),
			"dead letter": deadLetterTable(tbl, hopHeaders(msg, attempt), env, isReturn),
		} {
			if v, ok := out[headerDeath]; ok {
				if !isReturn || !reflect.DeepEqual(v, tbl[headerDeath]) {
					t.Fatalf("%s: carries x-death %#v (return %v)", name, v, isReturn)
				}
				if _, ok := readDeaths(v); !ok {
					t.Fatalf("%s: carries a malformed x-death %#v", name, v)
				}
			}
			for k, v := range out {
				switch {
				case k == headerDeliveryCount || k == headerCC || k == headerBCC:
					t.Fatalf("%s: carries %s", name, k)
				case isDeathHeader(k) && (!isReturn || !isString(v)):
					t.Fatalf("%s: carries %s = %#v (return %v)", name, k, v, isReturn)
				}
			}
			want := attempt + 1
			if name == "dead letter" {
				want = attempt
			}
			if got := out[ackwise.HeaderAttempt]; got != strconv.Itoa(want) {
				t.Fatalf("%s: ackwise-attempt %#v, want %d", name, got, want)
			}
		}
	})
}

// FuzzEventID: for any header table and message-id, the event ID is
// ackwise-event-id (as a scalar reads), else the message-id but one the
// adapter made up; and a copy the source moves (with the message-id
// copyOf gives it) reads as the same event ID.
func FuzzEventID(f *testing.F) {
	for _, s := range fuzzHeaderSeeds() {
		b := encodeFuzzTable(s)
		f.Add(b, "")
		f.Add(b, "mid-1")
		f.Add(b, anonIDPrefix+"7")
	}
	f.Fuzz(func(t *testing.T, data []byte, messageID string) {
		tbl := fuzzTable(data)
		h := fromTable(tbl)
		id := eventIDOf(h, messageID)
		want := ""
		if s, ok := scalarString(tbl[ackwise.HeaderEventID]); ok && s != "" {
			want = s
		} else if !strings.HasPrefix(messageID, anonIDPrefix) {
			want = messageID
		}
		if id != want {
			t.Fatalf("event ID %q, want %q", id, want)
		}
		copyID := messageID
		if copyID == "" {
			copyID = anonIDPrefix + "1"
		}
		msg := &ackwise.Message{Headers: h, Attempt: 1}
		out := moveTable(tbl, hopHeaders(msg, 2), "", false)
		if got := eventIDOf(fromTable(out), copyID); got != id {
			t.Fatalf("copy reads event ID %q, the delivery %q", got, id)
		}
	})
}

// FuzzURL: ConfigFromURL and SinkConfigFromURL, and the validation of
// what they return, do not panic on any URL, and neither their errors nor
// a printed config show the URL's password (in any escaping), unless the
// URL shows it elsewhere too (its path, query, user name) or the error
// for the same URL with another password has it as well. URLs naming TLS
// files (tls_ca, tls_cert, tls_key) are left out: reading files is not
// parsing.
func FuzzURL(f *testing.F) {
	for _, s := range []string{
		"amqp://guest:guest@127.0.0.1:5672/orders",
		"amqp://user:S3cret-pw@host:5672/orders?queue_type=quorum&prefetch=64&tiers=1s,10s,1m&declare=true",
		"amqps://user:S3cret-pw@host/orders?vhost=%2Fprod&consumer_timeout=30m&consumer_timeout_warn=20m",
		"rabbit://user:S3cret-pw@host/orders?tls=true&tls_server_name=x&tls_insecure_skip_verify=true",
		"rabbit://user:S3cret-pw@host/?exchange=ex&routing_key=k",
		"amqp://user:S3cret-pw@host/orders.dlq?plain=true",
		"amqp://user:S3cret-pw@host/orders?prefetch=S3cret-pw",
		"amqp://user:S3cret-pw@host/orders?bogus=1",
		"amqp://user:S3cret-pw@host/orders?tiers=1s;2s",
		"amqp://user:S3cret-pw@host/orders?heartbeat=500ms",
		"amqp://user:p%40ss%2Fw%3Frd@host/orders?dlq=",
		"amqp://guest:1234/hunter2@localhost:5672/orders?bogus=1",
		"amqp://guest:1234?hunter2@localhost:5672/orders",
		"amqp://guest:S3CR@hunter/two@127.0.0.1:5672/orders",
		"amqp://user:S3cret-pw@[::1]:5672/orders?vhost=a%zz",
		"amqp://user:S3cret-pw@host:99999/orders?queue_type=lazy",
		"mem://user:S3cret-pw@host/orders",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		if q, err := url.ParseQuery(u.RawQuery); err == nil && (q.Has("tls_ca") || q.Has("tls_cert") || q.Has("tls_key")) {
			return
		}
		if strings.Contains(u.RawQuery, "tls_") {
			return // a malformed query may still be read in part elsewhere
		}
		// An error of a URL, or of the validation of what it gave, names URL
		// parameters, not Config fields, and every URL error is an
		// urlparam error.
		urlErr := func(err error) string {
			if !errors.Is(err, urlparam.ErrParam) {
				t.Fatalf("URL %q: error %v is not an urlparam error", raw, err)
			}
			return noField(t, raw, err)
		}
		texts := func(u *url.URL) []string {
			var out []string
			if cfg, err := ConfigFromURL(u); err != nil {
				out = append(out, urlErr(err))
			} else {
				out = append(out, fmt.Sprint(cfg), fmt.Sprintf("%#v", cfg))
				if j, err := json.Marshal(cfg); err == nil {
					out = append(out, string(j))
				}
				if _, err := cfg.validate(); err != nil {
					out = append(out, noField(t, raw, err))
				}
			}
			if sc, declare, err := SinkConfigFromURL(u); err != nil {
				out = append(out, urlErr(err))
			} else {
				out = append(out, fmt.Sprint(sc), fmt.Sprintf("%#v", sc))
				if _, err := sc.validate(); err != nil {
					out = append(out, noField(t, raw, err))
				}
				if declare != nil {
					if _, err := declare.validate(); err != nil {
						out = append(out, noField(t, raw, err))
					}
				}
			}
			return out
		}
		got := texts(u)
		pw, ok := "", false
		if u.User != nil {
			pw, ok = u.User.Password()
		}
		if !ok || len(pw) < 4 {
			return
		}
		other := *u
		other.User = url.UserPassword(u.User.Username(), "Q9z7w3K1")
		elsewhere := strings.Join(append(texts(&other), u.User.Username(), u.Host, u.Path, u.RawPath, u.RawQuery, u.Fragment, u.Opaque, unescape(u.RawQuery), "xxxxx"), "\n")
		for _, form := range []string{pw, url.QueryEscape(pw), url.PathEscape(pw), strings.TrimPrefix(url.UserPassword("", pw).String(), ":")} {
			if len(form) < 4 || strings.Contains(elsewhere, form) {
				continue
			}
			for _, s := range got {
				if strings.Contains(s, form) {
					t.Fatalf("URL %q: password shown as %q in %q", raw, form, s)
				}
			}
		}
	})
}

// goField matches the name of a Config or SinkConfig field as the
// validation's errors give it.
var goField = regexp.MustCompile(`\b(TLS|Queue|QueueType|Prefetch|DeclareTopology|Plain|DelayTiers|DeadLetterQueue|ConsumerTimeout|ConsumerTimeoutWarn|Heartbeat|ConnectionName|Exchange|RoutingKey)(\[\d+\])? (=|is |has )`)

// noField fails the test if err, from parsing raw or validating what it
// gave, names a Go field; it returns err's text.
func noField(t *testing.T, raw string, err error) string {
	t.Helper()
	if m := goField.FindString(err.Error()); m != "" {
		t.Fatalf("URL %q: error %q names the Go field %q, not a URL parameter", raw, err, m)
	}
	return err.Error()
}

func unescape(s string) string {
	if u, err := url.QueryUnescape(s); err == nil {
		return u
	}
	return s
}
