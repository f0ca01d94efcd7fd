package urlparam_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/internal/urlparam"
)

var table = func() *urlparam.Table {
	t := urlparam.NewTable("demo",
		append([]urlparam.Param{
			{Name: "group", Side: urlparam.Source, Type: "string", Doc: "consumer group"},
			{Name: "key", Side: urlparam.Sink, Type: "string", Doc: "routing key"},
			{Name: "lease", Side: urlparam.Both, Type: "duration", Doc: "lease"},
			{Name: "wait", Side: urlparam.Both, Type: "duration", Doc: "-1: do not wait"},
			{Name: "n", Side: urlparam.Both, Type: "int", Doc: "a count"},
			{Name: "n32", Side: urlparam.Both, Type: "int", Doc: "a count"},
			{Name: "on", Side: urlparam.Both, Type: "bool", Doc: "a switch"},
			{Name: "mode", Side: urlparam.Both, Type: "one of fast, slow", Doc: "a mode"},
			{Name: "tiers", Side: urlparam.Both, Type: "list of durations", Doc: "tiers"},
		}, urlparam.TLSParams()...)...)
	t.Schemes = []string{"demo", "demos"}
	t.NeedHost = true
	t.Form = "demo://host/name"
	return t
}()

func parse(t *testing.T, raw string, side urlparam.Side) (*urlparam.Query, error) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("url.Parse(%q): %v", raw, err)
	}
	return table.Parse(u, side)
}

type values struct {
	group, key, mode string
	lease, wait      time.Duration
	n                int
	n32              int32
	on               bool
	tiers            []time.Duration
}

func read(q *urlparam.Query) (values, error) {
	v := values{lease: 7 * time.Second, n: 3} // defaults kept when not given
	q.String(&v.group, "group")
	q.String(&v.key, "key")
	q.Duration(&v.lease, "lease", 1, urlparam.MaxDuration)
	q.Duration(&v.wait, "wait", urlparam.MinDuration, urlparam.MaxDuration)
	urlparam.Int(q, &v.n, "n", 0, 100)
	urlparam.Int(q, &v.n32, "n32", 0, 1<<31-1)
	q.Bool(&v.on, "on")
	urlparam.Enum(q, &v.mode, "mode", "fast", "slow")
	q.Durations(&v.tiers, "tiers", time.Millisecond, urlparam.MaxDuration)
	return v, q.Err()
}

func TestParseReadsEveryType(t *testing.T) {
	q, err := parse(t, "demo://u:pw@h/x?group=g+1&lease=1m30s&wait=-1&n=42&n32=2147483647&on=true&mode=SLOW&tiers=1s,+10s,1m", urlparam.Source)
	if err != nil {
		t.Fatal(err)
	}
	v, err := read(q)
	if err != nil {
		t.Fatal(err)
	}
	want := values{group: "g 1", mode: "slow", lease: 90 * time.Second, wait: -1, n: 42, n32: 1<<31 - 1, on: true, tiers: []time.Duration{time.Second, 10 * time.Second, time.Minute}}
	if !slices.Equal(v.tiers, want.tiers) {
		t.Errorf("tiers %v, want %v", v.tiers, want.tiers)
	}
	v.tiers, want.tiers = nil, nil
	if !reflect.DeepEqual(v, want) {
		t.Errorf("got %+v, want %+v", v, want)
	}
	if got := q.Given(); !slices.Equal(got, []string{"group", "lease", "wait", "n", "n32", "on", "mode", "tiers"}) {
		t.Errorf("Given() = %v", got)
	}
	if !q.Has("tiers") || q.Has("key") || q.First("key", "n", "on") != "n" || q.First("key") != "" {
		t.Error("Has or First wrong")
	}
}

func TestDefaultsKept(t *testing.T) {
	q, err := parse(t, "demo://h/x?on=false&", urlparam.Sink)
	if err != nil {
		t.Fatal(err)
	}
	v, err := read(q)
	if err != nil || !reflect.DeepEqual(v, values{lease: 7 * time.Second, n: 3}) {
		t.Errorf("got %+v, %v", v, err)
	}
}

func TestErrors(t *testing.T) {
	for _, c := range []struct {
		url   string
		side  urlparam.Side
		param string // the *Error's Param
		want  string // the whole error text
	}{
		{"demo://u:pw@h/x?group=a;b", urlparam.Source, "", `demo: URL query is malformed: a ';' separates parameters (use '&'; a literal ';' is %3B)`},
		{"demo://u:pw@h/x?group=%zz", urlparam.Source, "", `demo: URL query is malformed: a bad %-escape (a literal '%' is %25)`},
		{"demo://u:pw@h/x?grup=a", urlparam.Source, "grup", `demo: URL parameter "grup" is unknown (known: group, key, lease, wait, n, n32, on, mode, tiers, tls_ca, tls_cert, tls_key, tls_server_name, tls_insecure_skip_verify)`},
		{"demo://u:pw@h/x?=1", urlparam.Source, "", `demo: URL query has a value without a parameter name ("=1")`},
		{"demo://u:pw@h/x?n=1&n=1", urlparam.Source, "n", `demo: URL parameter "n" is given more than once`},
		{"demo://u:pw@h/x?n=", urlparam.Source, "n", `demo: URL parameter "n" is empty: give a value or leave it out`},
		{"demo://u:pw@h/x?on", urlparam.Source, "on", `demo: URL parameter "on" is empty: give a value or leave it out`},
		{"demo://u:pw@h/x?group=g", urlparam.Sink, "group", `demo: URL parameter "group" is for a source; a sink URL does not take it`},
		{"demo://u:pw@h/x?key=k", urlparam.Source, "key", `demo: URL parameter "key" is for a sink; a source URL does not take it`},
		{"demo://u:pw@h/x?lease=0", urlparam.Both, "lease", `demo: URL parameter "lease" = "0": want a positive Go duration such as 30s`},
		{"demo://u:pw@h/x?lease=-1", urlparam.Both, "lease", `demo: URL parameter "lease" = "-1": want a positive Go duration such as 30s`},
		{"demo://u:pw@h/x?wait=soon", urlparam.Both, "wait", `demo: URL parameter "wait" = "soon": want a Go duration such as 30s, or -1`},
		{"demo://u:pw@h/x?n=101", urlparam.Both, "n", `demo: URL parameter "n" = "101": want an integer in [0, 100]`},
		{"demo://u:pw@h/x?n32=2147483648", urlparam.Both, "n32", `demo: URL parameter "n32" = "2147483648": want an integer in [0, 2147483647]`},
		{"demo://u:pw@h/x?on=yes", urlparam.Both, "on", `demo: URL parameter "on" = "yes": want true or false`},
		{"demo://u:pw@h/x?mode=medium", urlparam.Both, "mode", `demo: URL parameter "mode" = "medium": want one of fast, slow`},
		{"demo://u:pw@h/x?tiers=1s,,2s", urlparam.Both, "tiers", `demo: URL parameter "tiers" = "1s,,2s": "" is not a Go duration of at least 1ms; want a comma-separated list such as 1s,10s,1m`},
		{"demo://u:pw@h/x?tiers=1s,1us", urlparam.Both, "tiers", `demo: URL parameter "tiers" = "1s,1us": "1us" is not a Go duration of at least 1ms; want a comma-separated list such as 1s,10s,1m`},
		{"other://u:pw@h/x", urlparam.Both, "", `demo: URL "other://u:xxxxx@h/x" has scheme "other"; want demo, demos`},
		{"demo://u:pw@/x", urlparam.Both, "", `demo: URL "demo://u:xxxxx@/x" has no host (want demo://host/name)`},
		{"demo://h/x?tls_cert=a.pem", urlparam.Both, "", `demo: URL has one of tls_cert= and tls_key=; give both or neither`},
		{"demo://h/x?tls_ca=/dev/zero", urlparam.Both, "tls_ca", `demo: URL parameter "tls_ca" = "/dev/zero": cannot read it: not a regular file`},
		{"demo://h/x?tls_ca=/nonexistent/ca.pem", urlparam.Both, "tls_ca", `demo: URL parameter "tls_ca" = "/nonexistent/ca.pem": cannot read it: open /nonexistent/ca.pem: no such file or directory`},
	} {
		q, err := parse(t, c.url, c.side)
		if err == nil {
			_, err = read(q)
			if err == nil {
				q.TLS()
				err = q.Err()
			}
		}
		var e *urlparam.Error
		if !errors.Is(err, urlparam.ErrParam) || !errors.As(err, &e) || e.Param != c.param || err.Error() != c.want {
			t.Errorf("%s (%v):\n got %v\nwant %s (param %q)", c.url, c.side, err, c.want, c.param)
		}
	}
}

// TestFirstErrorKept: after an error the getters do nothing, so the error
// names the first bad parameter and nothing after it is set.
func TestFirstErrorKept(t *testing.T) {
	q, err := parse(t, "demo://h/x?n=x&on=true&tiers=1s", urlparam.Both)
	if err != nil {
		t.Fatal(err)
	}
	v, err := read(q)
	var e *urlparam.Error
	if !errors.As(err, &e) || e.Param != "n" || v.on || v.tiers != nil {
		t.Errorf("got %+v, %v", v, err)
	}
}

func TestRequire(t *testing.T) {
	q, err := parse(t, "demo://h/x?n=1", urlparam.Source)
	if err != nil {
		t.Fatal(err)
	}
	if !q.Require("n", "a source needs one") || q.Err() != nil {
		t.Fatal("n is given")
	}
	if q.Require("group", "a source needs one") {
		t.Fatal("group is not given")
	}
	if got, want := q.Err().Error(), "demo: URL has no group= parameter; a source needs one"; got != want || !errors.Is(q.Err(), urlparam.ErrParam) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestMisplacedUserInfoRefusedFirst(t *testing.T) {
	// The password "12345?grup=S3CRET" is cut short into the query.
	_, err := parse(t, "demo://u:12345?grup=S3CRET@h/x", urlparam.Sink)
	if !errors.Is(err, adapters.ErrMisplacedUserInfo) || !errors.Is(err, urlparam.ErrParam) || strings.Contains(err.Error(), "S3CRET") || !strings.HasPrefix(err.Error(), "demo: URL holds '@'") {
		t.Errorf("got %v", err)
	}
}

func TestErrorfAndMisplaced(t *testing.T) {
	q, err := parse(t, "demo://h/x?mode=fast&key=k", urlparam.Both)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := q.Errorf("mode", "is for queues only").Error(), `demo: URL parameter "mode" = "fast": is for queues only`; got != want {
		t.Errorf("Errorf: %q, want %q", got, want)
	}
	if got, want := q.Misplaced("key", "is for a sink only with declare=true").Error(), `demo: URL parameter "key" is for a sink only with declare=true`; got != want {
		t.Errorf("Misplaced: %q, want %q", got, want)
	}
	if got, want := q.Errorf("", "names no queue").Error(), `demo: URL names no queue`; got != want {
		t.Errorf("Errorf of the URL: %q, want %q", got, want)
	}
}

func TestUnknownGetterPanics(t *testing.T) {
	q, err := parse(t, "demo://h/x", urlparam.Both)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	q.Has("nope")
}

func TestNewTablePanicsOnBadTable(t *testing.T) {
	for _, ps := range [][]urlparam.Param{
		{{Name: "a", Side: urlparam.Both}, {Name: "a", Side: urlparam.Sink}},
		{{Name: "", Side: urlparam.Both}},
		{{Name: "a"}},
		{{Name: "a", Side: 8}},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("NewTable(%v) did not panic", ps)
				}
			}()
			urlparam.NewTable("demo", ps...)
		}()
	}
}

func TestTLS(t *testing.T) {
	dir := t.TempDir()
	certPEM, keyPEM := selfSigned(t)
	ca, cert, key, empty := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), filepath.Join(dir, "empty")
	for f, b := range map[string][]byte{ca: certPEM, cert: certPEM, key: keyPEM, empty: []byte("nothing")} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	e := url.QueryEscape
	q, err := parse(t, "demo://h/x?tls_ca="+e(ca)+"&tls_cert="+e(cert)+"&tls_key="+e(key)+"&tls_server_name=broker&tls_insecure_skip_verify=true", urlparam.Both)
	if err != nil {
		t.Fatal(err)
	}
	c := q.TLS()
	if c == nil || q.Err() != nil || c.RootCAs == nil || len(c.Certificates) != 1 || c.ServerName != "broker" || !c.InsecureSkipVerify || c.MinVersion != tls.VersionTLS12 {
		t.Fatalf("TLS() = %+v, %v", c, q.Err())
	}
	q, _ = parse(t, "demo://h/x?n=1", urlparam.Both)
	if c := q.TLS(); c != nil || q.Err() != nil {
		t.Fatalf("no TLS parameter: %+v, %v", c, q.Err())
	}
	for raw, want := range map[string]string{
		"demo://h/x?tls_ca=" + e(empty):                          `"tls_ca" = "` + empty + `": no PEM certificate in the file`,
		"demo://h/x?tls_cert=" + e(cert) + "&tls_key=" + e(cert): `"tls_cert" = "` + cert + `": with tls_key = "` + cert + `": not a certificate and its key`,
		"demo://h/x?tls_cert=" + e(cert) + "&tls_key=" + e(dir):  `"tls_key" = "` + dir + `": cannot read it: not a regular file`,
	} {
		q, _ = parse(t, raw, urlparam.Both)
		if c := q.TLS(); c != nil || q.Err() == nil || !strings.Contains(q.Err().Error(), want) {
			t.Errorf("%s: %+v, %v; want an error containing %s", raw, c, q.Err(), want)
		}
	}
}

// selfSigned returns a self-signed certificate and its key, PEM-encoded.
func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func TestMarkdown(t *testing.T) {
	md := table.Markdown()
	if !strings.HasPrefix(md, "| Parameter | Type | Side | Meaning |\n") || !strings.Contains(md, "| `group` | string | source | consumer group |\n") || !strings.Contains(md, "| `lease` | duration | both | lease |\n") {
		t.Errorf("Markdown():\n%s", md)
	}
}

func TestDocumentedIn(t *testing.T) {
	f := filepath.Join(t.TempDir(), "doc.md")
	if err := os.WriteFile(f, []byte("# Demo\n\n"+table.Markdown()+"\nmore\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := table.DocumentedIn(f); err != nil {
		t.Errorf("DocumentedIn: %v", err)
	}
	if err := os.WriteFile(f, []byte(strings.Replace(table.Markdown(), "consumer group", "group", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := table.DocumentedIn(f); err == nil || !strings.Contains(err.Error(), "lacks the table of demo URL parameters") {
		t.Errorf("DocumentedIn of a stale table: %v", err)
	}
}
