// Package urlparam reads the query parameters of an adapter's URL
// ("kafka://host/orders?group=billing&tiers=1s,10s") strictly, against a
// table of the parameters the adapter knows, each marked as one for a
// source, a sink or both.
//
// Strict means that nothing a URL gives is silently dropped: the raw query
// is parsed here, not with url.URL.Query (which drops a pair with a ';'
// separator or a bad %-escape), and an unknown, repeated or empty
// parameter, a parameter of the other side (a source's group= on a sink
// URL) and a value of the wrong type are errors.
//
// Every error is an *[Error], which matches [ErrParam] with errors.Is, and
// reads "<adapter>: URL parameter "<name>" …": it names the URL parameter
// and the adapter, never a Go field, and never shows the URL's password
// (the URL itself is shown only through adapters.RedactURL, and a URL whose
// password was cut short into its query is refused before any parameter is
// read, by adapters.RefuseMisplacedUserInfo).
//
// Use: an adapter declares its table once,
//
//	var params = urlparam.NewTable("kafka", urlparam.Param{Name: "group", Side: urlparam.Source, Doc: "consumer group"}, …)
//
// and its URL parser reads a URL for one side:
//
//	q, err := params.Parse(u, urlparam.Source) // prelude, strict query, sides
//	if err != nil { return err }
//	q.Require("group", "a source needs one")
//	q.String(&cfg.Group, "group")
//	q.Durations(&cfg.RetryTiers, "tiers", time.Millisecond, urlparam.MaxDuration)
//	if err := q.Err(); err != nil { return err }
//
// The getters leave their destination as it was when the URL does not give
// the parameter, so a destination holding a default keeps it; the first
// error a getter meets is kept and returned by [Query.Err], and the
// getters after it do nothing.
package urlparam

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ackwise/ackwise/adapters"
)

// ErrParam is matched (errors.Is) by every error this package returns. It
// is adapters.ErrBadURL, which programs match.
var ErrParam = adapters.ErrBadURL

// Error is an error in an adapter's URL. Its text is
//
//	<Adapter>: URL parameter "<Param>" = "<Value>": <Reason>   a bad value
//	<Adapter>: URL parameter "<Param>" <Reason>                 a misplaced parameter
//	<Adapter>: URL <Reason>                                     the URL as a whole (Param "")
//	<Adapter>: <Err>                                            Param and Reason "": Err says it all
type Error struct {
	Adapter string // "kafka", "rabbitmq", "memory"
	Param   string // the URL parameter; "" for an error of the URL as a whole
	Value   string // the value given, shown when ShowValue
	// ShowValue: the error is about the value, which the text quotes.
	ShowValue bool
	Reason    string
	Err       error // the underlying error (reading a file named by the parameter), or nil
}

func (e *Error) Error() string {
	switch {
	case e.Param == "" && e.Reason == "" && e.Err != nil:
		return fmt.Sprintf("%s: %v", e.Adapter, e.Err)
	case e.Param == "" && !e.ShowValue:
		return fmt.Sprintf("%s: URL %s", e.Adapter, e.Reason)
	case e.ShowValue:
		return fmt.Sprintf("%s: URL parameter %q = %q: %s", e.Adapter, e.Param, e.Value, e.Reason)
	default:
		return fmt.Sprintf("%s: URL parameter %q %s", e.Adapter, e.Param, e.Reason)
	}
}

// Is makes errors.Is(err, ErrParam) hold.
func (e *Error) Is(target error) bool { return target == ErrParam }

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// Side says which URLs take a parameter: a source's, a sink's or both.
type Side uint8

// The sides.
const (
	Source Side = 1 << iota
	Sink
	Both = Source | Sink
)

// String returns "source", "sink" or "both".
func (s Side) String() string {
	switch s {
	case Source:
		return "source"
	case Sink:
		return "sink"
	case Both:
		return "both"
	}
	return "Side(" + strconv.Itoa(int(s)) + ")"
}

// Param is one URL parameter an adapter knows.
type Param struct {
	Name string
	Side Side
	Type string // "duration", "int", "bool", "string", "list of durations", "one of a, b", … (for docs)
	Doc  string // what it means (for docs)
}

// Table is the parameters of one adapter's URLs. Build it with NewTable.
type Table struct {
	adapter string
	params  []Param
	byName  map[string]int
	// Schemes are the URL schemes the adapter's parser takes (lower case);
	// empty: any. Parse refuses another.
	Schemes []string
	// NeedHost: Parse refuses a URL without a host, showing Form.
	NeedHost bool
	// Form is the URL's shape for error messages ("kafka://host:9092/topic").
	Form string
}

// NewTable returns the table of adapter's URL parameters. adapter prefixes
// every error ("kafka"). A name given twice, an empty one or a zero Side
// panics: the table is a programming error, not bad input.
func NewTable(adapter string, params ...Param) *Table {
	t := &Table{adapter: adapter, params: params, byName: make(map[string]int, len(params))}
	for i, p := range params {
		if p.Name == "" || p.Side&Both == 0 || p.Side&^Both != 0 {
			panic(fmt.Sprintf("urlparam: %s: bad parameter %+v", adapter, p))
		}
		if _, dup := t.byName[p.Name]; dup {
			panic("urlparam: " + adapter + ": parameter " + p.Name + " listed twice")
		}
		t.byName[p.Name] = i
	}
	return t
}

// Adapter returns the adapter name the table's errors start with.
func (t *Table) Adapter() string { return t.adapter }

// Params returns the parameters, in the order NewTable got them.
func (t *Table) Params() []Param { return slices.Clone(t.params) }

// Only returns the names of the parameters for side alone (Source: those
// a sink does not take), in table order: adapters.Opener.SourceParams.
func (t *Table) Only(side Side) []string {
	var out []string
	for _, p := range t.params {
		if p.Side == side {
			out = append(out, p.Name)
		}
	}
	return out
}

// Names returns the parameter names for side (Both: all), in table order.
func (t *Table) Names(side Side) []string {
	var out []string
	for _, p := range t.params {
		if p.Side&side != 0 {
			out = append(out, p.Name)
		}
	}
	return out
}

// Markdown returns the table as a Markdown table (parameter, type, side,
// meaning), for docs.
func (t *Table) Markdown() string {
	var b strings.Builder
	b.WriteString("| Parameter | Type | Side | Meaning |\n|---|---|---|---|\n")
	for _, p := range t.params {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", p.Name, p.Type, p.Side, p.Doc)
	}
	return b.String()
}

// DocumentedIn returns an error unless the file named path holds the
// table as Markdown gives it: a test of each adapter calls it, so that the
// docs' table of its parameters follows the code.
func (t *Table) DocumentedIn(path string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if md := t.Markdown(); !strings.Contains(string(doc), md) {
		return fmt.Errorf("%s lacks the table of %s URL parameters:\n%s", path, t.adapter, md)
	}
	return nil
}

func (t *Table) errorf(param, format string, args ...any) *Error {
	return &Error{Adapter: t.adapter, Param: param, Reason: fmt.Sprintf(format, args...)}
}

// Parse checks u and reads its query for a URL of side (Source or Sink;
// Both: a URL whose side is not known yet, taking every parameter). In
// order, it refuses: a URL whose password was cut short into its host,
// path, query or fragment (adapters.RefuseMisplacedUserInfo, without
// showing the URL); a scheme not in t.Schemes; a URL without a host when
// t.NeedHost; a malformed query (a ';' separator, a bad %-escape); an
// unknown parameter; one given twice; one with an empty value; one not
// for side.
func (t *Table) Parse(u *url.URL, side Side) (*Query, error) {
	if adapters.MisplacedUserInfo(u) {
		return nil, &Error{Adapter: t.adapter, Err: adapters.ErrMisplacedUserInfo}
	}
	if len(t.Schemes) > 0 && !slices.Contains(t.Schemes, strings.ToLower(u.Scheme)) {
		return nil, t.errorf("", "%s has scheme %q; want %s", adapters.RedactURL(u), u.Scheme, strings.Join(t.Schemes, ", "))
	}
	if t.NeedHost && u.Host == "" {
		return nil, t.errorf("", "%s has no host (want %s)", adapters.RedactURL(u), t.Form)
	}
	vals, err := t.parseQuery(u.RawQuery)
	if err != nil {
		return nil, err
	}
	for _, name := range vals.order {
		p := t.params[t.byName[name]]
		if p.Side&side == 0 {
			other, this := "a sink", "source"
			if p.Side == Source {
				other, this = "a source", "sink"
			}
			return nil, t.errorf(name, "is for %s; a %s URL does not take it", other, this)
		}
	}
	return &Query{t: t, u: u, side: side, vals: vals.m, order: vals.order}, nil
}

type values struct {
	m     map[string]string
	order []string
}

// parseQuery splits raw as url.ParseQuery does (pairs separated by '&',
// empty pairs skipped, '+' a space) but refuses, rather than drops, what it
// cannot read, and refuses unknown, repeated and empty parameters.
func (t *Table) parseQuery(raw string) (values, error) {
	v := values{m: map[string]string{}}
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		if pair == "" {
			continue
		}
		if strings.Contains(pair, ";") {
			return v, t.errorf("", "query is malformed: a ';' separates parameters (use '&'; a literal ';' is %%3B)")
		}
		k, val, _ := strings.Cut(pair, "=")
		k, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(val)
		if err := errors.Join(err1, err2); err != nil {
			return v, &Error{Adapter: t.adapter, Reason: "query is malformed: a bad %-escape (a literal '%' is %25)", Err: err}
		}
		if k == "" {
			return v, t.errorf("", "query has a value without a parameter name (%q)", pair)
		}
		if _, ok := t.byName[k]; !ok {
			return v, t.errorf(k, "is unknown (known: %s)", strings.Join(t.Names(Both), ", "))
		}
		if _, dup := v.m[k]; dup {
			return v, t.errorf(k, "is given more than once")
		}
		if val == "" {
			// Read as "not given", it would run with the default.
			return v, t.errorf(k, "is empty: give a value or leave it out")
		}
		v.m[k] = val
		v.order = append(v.order, k)
	}
	return v, nil
}

// Query is the parameters of one URL, read by Table.Parse. Its getters set
// a destination from a parameter the URL gives and leave it alone
// otherwise. The first error a getter meets is kept ([Query.Err]); the
// getters after it do nothing and return false. A getter asked for a
// parameter not in the table panics (a programming error).
type Query struct {
	t     *Table
	u     *url.URL
	side  Side
	vals  map[string]string
	order []string
	err   error
}

// URL returns the URL the query is of.
func (q *Query) URL() *url.URL { return q.u }

// Err returns the first error a getter, Require or Fail met, or nil.
func (q *Query) Err() error { return q.err }

// Has reports whether the URL gives the parameter name.
func (q *Query) Has(name string) bool {
	q.known(name)
	_, ok := q.vals[name]
	return ok
}

// Given returns the names of the parameters the URL gives, in its order.
func (q *Query) Given() []string { return slices.Clone(q.order) }

// First returns the first of names the URL gives, or "".
func (q *Query) First(names ...string) string {
	for _, n := range names {
		if q.Has(n) {
			return n
		}
	}
	return ""
}

func (q *Query) known(name string) {
	if _, ok := q.t.byName[name]; !ok {
		panic("urlparam: " + q.t.adapter + ": parameter " + name + " is not in the table")
	}
}

// get returns name's value if the URL gives it and no error came before.
func (q *Query) get(name string) (string, bool) {
	q.known(name)
	if q.err != nil {
		return "", false
	}
	v, ok := q.vals[name]
	return v, ok
}

// Fail keeps err as the query's error if none came first, and returns the
// query's error.
func (q *Query) Fail(err error) error {
	if q.err == nil {
		q.err = err
	}
	return q.err
}

// Errorf returns an *Error about the parameter name (a value the URL gives,
// or "" for the URL as a whole): with the value quoted when the URL gives
// name, so reason says what is wrong with it ("want a queue name"). It
// does not keep it; Fail does.
func (q *Query) Errorf(name, format string, args ...any) *Error {
	e := q.t.errorf(name, format, args...)
	if name != "" {
		e.Value, e.ShowValue = q.vals[name]
	}
	return e
}

// Misplaced returns an *Error saying the parameter name, which the URL
// gives, does not apply here: "<adapter>: URL parameter "<name>" <reason>",
// e.g. reason "is for a sink only with declare=true".
func (q *Query) Misplaced(name, reason string) *Error {
	return q.t.errorf(name, "%s", reason)
}

// Require keeps an error unless the URL gives name: "<adapter>: URL has
// no <name>= parameter; <why>", why saying who needs it ("a source needs
// one"). It returns whether the URL gives it.
func (q *Query) Require(name, why string) bool {
	if q.Has(name) {
		return true
	}
	q.Fail(q.t.errorf("", "has no %s= parameter; %s", name, why))
	return false
}

func (q *Query) bad(name, v, format string, args ...any) bool {
	q.Fail(&Error{Adapter: q.t.adapter, Param: name, Value: v, ShowValue: true, Reason: fmt.Sprintf(format, args...)})
	return false
}

// String sets *dst to name's value (never empty: Parse refuses an empty
// one).
func (q *Query) String(dst *string, name string) bool {
	v, ok := q.get(name)
	if ok {
		*dst = v
	}
	return ok
}

// Bool sets *dst from name: true or false (and the other spellings of
// strconv.ParseBool: 1, 0, t, f, TRUE, …).
func (q *Query) Bool(dst *bool, name string) bool {
	v, ok := q.get(name)
	if !ok {
		return false
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return q.bad(name, v, "want true or false")
	}
	*dst = b
	return true
}

// The widest duration bounds, for Duration and Durations.
const (
	MinDuration = time.Duration(math.MinInt64)
	MaxDuration = time.Duration(math.MaxInt64)
)

// Duration sets *dst from name: a Go duration ("30s", "1m30s", "0") in
// [lo, hi]. When lo ≤ -1, a bare "-1" is taken too, as -1: the value
// that means "off" or "do not wait" in the adapters' configs.
func (q *Query) Duration(dst *time.Duration, name string, lo, hi time.Duration) bool {
	v, ok := q.get(name)
	if !ok {
		return false
	}
	d, ok := parseDuration(v, lo, hi)
	if !ok {
		return q.bad(name, v, "want %s", durationWant(lo, hi))
	}
	*dst = d
	return true
}

func parseDuration(v string, lo, hi time.Duration) (time.Duration, bool) {
	if v == "-1" && lo <= -1 {
		return -1, true
	}
	d, err := time.ParseDuration(v)
	return d, err == nil && d >= lo && d <= hi
}

func durationWant(lo, hi time.Duration) string {
	var s string
	switch {
	case lo == MinDuration && hi == MaxDuration:
		s = "a Go duration such as 30s"
	case lo == 0 && hi == MaxDuration:
		s = "a non-negative Go duration such as 30s"
	case lo == 1 && hi == MaxDuration:
		s = "a positive Go duration such as 30s"
	case hi == MaxDuration:
		s = fmt.Sprintf("a Go duration of at least %v", lo)
	case lo == MinDuration:
		s = fmt.Sprintf("a Go duration of at most %v", hi)
	default:
		s = fmt.Sprintf("a Go duration in [%v, %v]", lo, hi)
	}
	if lo <= -1 {
		s += ", or -1"
	}
	return s
}

// Durations sets *dst from name: comma-separated Go durations
// ("1s,10s,1m"), each in [lo, hi] and each element non-empty (spaces
// around one are trimmed). Whether they must be sorted or distinct is the
// adapter's rule.
func (q *Query) Durations(dst *[]time.Duration, name string, lo, hi time.Duration) bool {
	v, ok := q.get(name)
	if !ok {
		return false
	}
	var out []time.Duration
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		d, ok := parseDuration(s, lo, hi)
		if !ok {
			return q.bad(name, v, "%q is not %s; want a comma-separated list such as 1s,10s,1m", s, durationWant(lo, hi))
		}
		out = append(out, d)
	}
	*dst = out
	return true
}

// Int sets *dst from name: a decimal integer in [lo, hi] (hi of
// math.MaxInt64: no upper bound).
func Int[T ~int | ~int32 | ~int64](q *Query, dst *T, name string, lo, hi T) bool {
	v, ok := q.get(name)
	if !ok {
		return false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < int64(lo) || n > int64(hi) {
		switch {
		case int64(hi) == math.MaxInt64 && lo == 0:
			return q.bad(name, v, "want a non-negative integer")
		case int64(hi) == math.MaxInt64:
			return q.bad(name, v, "want an integer of at least %d", lo)
		default:
			return q.bad(name, v, "want an integer in [%d, %d]", lo, hi)
		}
	}
	*dst = T(n)
	return true
}

// Enum sets *dst from name: one of allowed, matched without regard to case
// and set as allowed spells it. The error lists them.
func Enum[T ~string](q *Query, dst *T, name string, allowed ...T) bool {
	v, ok := q.get(name)
	if !ok {
		return false
	}
	for _, a := range allowed {
		if strings.EqualFold(v, string(a)) {
			*dst = a
			return true
		}
	}
	names := make([]string, len(allowed))
	for i, a := range allowed {
		names[i] = string(a)
	}
	return q.bad(name, v, "want one of %s", strings.Join(names, ", "))
}
