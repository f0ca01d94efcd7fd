package urlparam_test

import (
	"errors"
	"net/url"
	"testing"

	"github.com/ackwise/ackwise/adapters/internal/urlparam"
)

// FuzzParse: for any query, Parse and the getters do not panic, every
// error matches ErrParam, and Parse accepts a query only if url.ParseQuery
// reads it the same way (so nothing it would drop is taken), with each
// parameter once, non-empty, in the table and for the side.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"", "group=g", "group=g&key=k", "n=1;on=true", "n=%zz", "n=1&n=2", "n=", "on",
		"lease=1s&wait=-1&n=5&n32=7&on=t&mode=FAST&tiers=1s,10s", "tiers=1s,,2s", "a+b=c", "&&n=1&",
		"tiers=9223372036854775807ns", "n=-9223372036854775809", "mode=%C3%A9", "=x", "tls_server_name=h",
	} {
		f.Add(s, uint8(urlparam.Source))
		f.Add(s, uint8(urlparam.Sink))
	}
	f.Fuzz(func(t *testing.T, query string, side uint8) {
		s := urlparam.Side(side%3 + 1)
		u := &url.URL{Scheme: "demo", Host: "h", Path: "/x", RawQuery: query}
		q, err := table.Parse(u, s)
		std, stdErr := url.ParseQuery(query)
		if err != nil {
			if !errors.Is(err, urlparam.ErrParam) {
				t.Fatalf("Parse(%q): %v does not match ErrParam", query, err)
			}
			return
		}
		if stdErr != nil {
			t.Fatalf("Parse(%q) took a query url.ParseQuery refuses: %v", query, stdErr)
		}
		for k, vs := range std {
			var got string
			if len(vs) != 1 || vs[0] == "" || !q.Has(k) || !q.String(&got, k) && q.Err() == nil || got != vs[0] {
				t.Fatalf("Parse(%q): %q = %q, url.ParseQuery: %q", query, k, got, vs)
			}
		}
		if len(q.Given()) != len(std) {
			t.Fatalf("Parse(%q) gives %v, url.ParseQuery %v", query, q.Given(), std)
		}
		for _, p := range table.Params() {
			if q.Has(p.Name) && p.Side&s == 0 {
				t.Fatalf("Parse(%q) for %v took %q, for %v", query, s, p.Name, p.Side)
			}
		}
		if _, err := read(q); err != nil && !errors.Is(err, urlparam.ErrParam) {
			t.Fatalf("getters on %q: %v does not match ErrParam", query, err)
		}
	})
}
