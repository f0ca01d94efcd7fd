package kafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/ackwise/ackwise/adapters"
)

func init() {
	adapters.Register("kafka", adapters.Opener{
		OpenSource: func(ctx context.Context, u *url.URL, _ adapters.OpenOptions) (adapters.Source, error) {
			cfg, err := ParseURL(u)
			if err != nil {
				return nil, err
			}
			return NewSource(ctx, cfg)
		},
		OpenSink: func(ctx context.Context, u *url.URL, _ adapters.OpenOptions) (adapters.Sink, error) {
			cfg, err := ParseSinkURL(u)
			if err != nil {
				return nil, err
			}
			return NewSink(ctx, cfg)
		},
	})
}

// ParseURL reads a SourceConfig from a kafka:// URL:
//
//	kafka://[user:password@]host:9092[,host2:9092]/topic?group=g&tiers=1m,10m&dlq=orders.dlq
//
// Query parameters:
//   - group: the consumer group (required to open a source);
//   - tiers: retry tiers, comma-separated Go durations (turns on retry topics);
//   - retry_prefix: retry topics are named <retry_prefix><tier> instead of
//     <topic>.retry.<tier>;
//   - dlq: the dead-letter topic (default <topic>.dlq);
//   - commit_interval, revoke_timeout: Go durations (revoke_timeout=-1: do
//     not wait, as in SourceConfig);
//   - poll_batch, fetch_max_bytes, fetch_max_partition_bytes:
//     SourceConfig.PollBatch, FetchMaxBytes and FetchMaxPartitionBytes;
//   - start: earliest (default) or latest;
//   - client_id;
//   - tls: true to dial with TLS; tls_ca (PEM file of CAs to trust),
//     tls_cert and tls_key (PEM files of a client certificate),
//     tls_server_name, tls_insecure_skip_verify=true (tests only): any of
//     these turns TLS on, and is an error beside tls=false; the PEM files
//     must be regular files of at most 1 MiB;
//   - sasl: plain, scram-sha-256 or scram-sha-512, with the user and
//     password from the URL's user info.
//
// An unknown, repeated or empty parameter is an error, and so are a malformed
// query (a ';' separator, a bad %-escape) and a user without sasl. Errors name the bad parameter
// and never contain the password.
//
// A sink uses only the brokers, the topic, client_id, tls* and sasl: parse
// a sink's URL with [ParseSinkURL], which refuses the others.
func ParseURL(u *url.URL) (SourceConfig, error) {
	var cfg SourceConfig
	if u.Scheme != "kafka" {
		return cfg, fmt.Errorf("kafka: URL %s: scheme must be kafka", adapters.RedactURL(u))
	}
	if u.Host == "" {
		return cfg, fmt.Errorf("kafka: URL %s: no brokers (want kafka://host:9092/topic)", adapters.RedactURL(u))
	}
	if err := adapters.RefuseMisplacedUserInfo("kafka", u); err != nil {
		return cfg, err
	}
	if strings.Contains(u.Path, "@") {
		// A topic cannot hold '@' (not even as %40): a password cut
		// short, most likely. Do not echo it.
		return cfg, fmt.Errorf("kafka: %w", adapters.ErrMisplacedUserInfo)
	}
	cfg.Brokers = strings.Split(u.Host, ",")
	cfg.Topic = strings.TrimPrefix(u.Path, "/")
	if cfg.Topic == "" {
		return cfg, fmt.Errorf("kafka: URL %s: no topic in the path", adapters.RedactURL(u))
	}
	// Not u.Query(): it drops the pairs it cannot parse (a ';' separator, a
	// bad %-escape), which would leave a parameter silently unset.
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return cfg, fmt.Errorf("kafka: URL %s: malformed query: %v", adapters.RedactURL(u), err)
	}
	for k, v := range q {
		if !urlParams[k] {
			return cfg, fmt.Errorf("kafka: URL %s: unknown parameter %q", adapters.RedactURL(u), k)
		}
		if len(v) > 1 {
			return cfg, fmt.Errorf("kafka: URL %s: parameter %q given %d times", adapters.RedactURL(u), k, len(v))
		}
		if v[0] == "" {
			return cfg, fmt.Errorf("kafka: URL %s: parameter %q is empty: give a value or leave it out", adapters.RedactURL(u), k)
		}
	}
	cfg.Group = q.Get("group")
	cfg.DeadLetterTopic = q.Get("dlq")
	cfg.ClientID = q.Get("client_id")
	cfg.StartOffset = q.Get("start")
	if v := q.Get("tiers"); v != "" {
		for _, f := range strings.Split(v, ",") {
			d, err := time.ParseDuration(strings.TrimSpace(f))
			if err != nil {
				return cfg, fmt.Errorf("kafka: URL parameter tiers = %q: %q is not a duration", v, f)
			}
			cfg.RetryTiers = append(cfg.RetryTiers, d)
		}
	}
	if v := q.Get("retry_prefix"); v != "" {
		cfg.RetryTopic = func(_ string, tier time.Duration) string { return v + FormatTier(tier) }
	}
	for name, dst := range map[string]*time.Duration{"commit_interval": &cfg.CommitInterval, "revoke_timeout": &cfg.RevokeTimeout} {
		if v := q.Get(name); v != "" {
			if name == "revoke_timeout" && v == "-1" {
				*dst = -1 // do not wait, as in SourceConfig
				continue
			}
			d, err := time.ParseDuration(v)
			if err != nil {
				return cfg, fmt.Errorf("kafka: URL parameter %s = %q: not a duration", name, v)
			}
			*dst = d
		}
	}
	if v := q.Get("poll_batch"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return cfg, fmt.Errorf("kafka: URL parameter poll_batch = %q: want a number of records (0: whole fetches)", v)
		}
		cfg.PollBatch = n
	}
	for name, dst := range map[string]*int32{"fetch_max_bytes": &cfg.FetchMaxBytes, "fetch_max_partition_bytes": &cfg.FetchMaxPartitionBytes} {
		if v := q.Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil || n < 0 {
				return cfg, fmt.Errorf("kafka: URL parameter %s = %q: want a number of bytes below 2^31 (0: the client's default)", name, v)
			}
			*dst = int32(n)
		}
	}
	tlsCfg, err := tlsFromQuery(q)
	if err != nil {
		return cfg, err
	}
	cfg.TLS = tlsCfg
	if mech := q.Get("sasl"); mech != "" {
		user := u.User.Username()
		pass, hasPass := u.User.Password()
		if user == "" || !hasPass {
			return cfg, fmt.Errorf("kafka: URL parameter sasl = %q needs a user and a password in the URL (kafka://user:password@host/...)", mech)
		}
		switch strings.ToLower(mech) {
		case "plain":
			cfg.SASL = plain.Auth{User: user, Pass: pass}.AsMechanism()
		case "scram-sha-256":
			cfg.SASL = scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()
		case "scram-sha-512":
			cfg.SASL = scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()
		default:
			return cfg, fmt.Errorf("kafka: URL parameter sasl = %q: want plain, scram-sha-256 or scram-sha-512", mech)
		}
	} else if u.User != nil {
		return cfg, fmt.Errorf("kafka: URL %s has a user but no sasl parameter (plain, scram-sha-256 or scram-sha-512)", adapters.RedactURL(u))
	}
	return cfg, nil
}

// ParseSinkURL is ParseURL for a sink ([adapters.OpenSink] uses it): a
// parameter only a source uses (group, tiers, retry_prefix, dlq,
// commit_interval, revoke_timeout, start, poll_batch, fetch_max_bytes,
// fetch_max_partition_bytes) is an error naming it, rather than ignored by
// NewSink.
func ParseSinkURL(u *url.URL) (SinkConfig, error) {
	cfg, err := ParseURL(u)
	if err != nil {
		return SinkConfig{}, err
	}
	q, _ := url.ParseQuery(u.RawQuery) // ParseURL refused a malformed query
	for _, k := range sourceOnlyParams {
		if q.Has(k) {
			return SinkConfig{}, fmt.Errorf("kafka: URL %s: parameter %q applies to sources only", adapters.RedactURL(u), k)
		}
	}
	return SinkConfig{ClientConfig: cfg.ClientConfig, Topic: cfg.Topic}, nil
}

// sourceOnlyParams are the parameters NewSink ignores.
var sourceOnlyParams = []string{
	"group", "tiers", "retry_prefix", "dlq", "commit_interval", "revoke_timeout", "start",
	"poll_batch", "fetch_max_bytes", "fetch_max_partition_bytes",
}

// urlParams are the query parameters ParseURL knows; any other is an error,
// so that a misspelt one (tier=1m) is not silently ignored.
var urlParams = map[string]bool{
	"group": true, "tiers": true, "retry_prefix": true, "dlq": true, "commit_interval": true, "revoke_timeout": true,
	"start": true, "client_id": true, "tls": true, "tls_ca": true, "tls_cert": true, "tls_key": true,
	"tls_server_name": true, "tls_insecure_skip_verify": true, "sasl": true,
	"poll_batch": true, "fetch_max_bytes": true, "fetch_max_partition_bytes": true,
}

func tlsFromQuery(q url.Values) (*tls.Config, error) {
	on, off := false, false
	if v := q.Get("tls"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("kafka: URL parameter tls = %q: want true or false", v)
		}
		on, off = b, !b
	}
	for _, k := range []string{"tls_ca", "tls_cert", "tls_key", "tls_server_name", "tls_insecure_skip_verify"} {
		if q.Get(k) != "" {
			if off {
				return nil, fmt.Errorf("kafka: URL parameters tls = false and %s: a TLS setting with TLS turned off", k)
			}
			on = true // any TLS setting turns TLS on
		}
	}
	if !on {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: q.Get("tls_server_name")}
	if v := q.Get("tls_insecure_skip_verify"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("kafka: URL parameter tls_insecure_skip_verify = %q: want true or false", v)
		}
		c.InsecureSkipVerify = b
	}
	if f := q.Get("tls_ca"); f != "" {
		pem, err := readPEM(f)
		if err != nil {
			return nil, fmt.Errorf("kafka: URL parameter tls_ca = %q: %w", f, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka: URL parameter tls_ca = %q: no PEM certificate in it", f)
		}
		c.RootCAs = pool
	}
	certF, keyF := q.Get("tls_cert"), q.Get("tls_key")
	if (certF == "") != (keyF == "") {
		return nil, fmt.Errorf("kafka: URL parameters tls_cert = %q and tls_key = %q: give both or neither", certF, keyF)
	}
	if certF != "" {
		certPEM, err := readPEM(certF)
		if err != nil {
			return nil, fmt.Errorf("kafka: URL parameter tls_cert = %q: %w", certF, err)
		}
		keyPEM, err := readPEM(keyF)
		if err != nil {
			return nil, fmt.Errorf("kafka: URL parameter tls_key = %q: %w", keyF, err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("kafka: URL parameters tls_cert = %q, tls_key = %q: %w", certF, keyF, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// maxPEMBytes bounds a PEM file named in a URL.
const maxPEMBytes = 1 << 20

// readPEM reads the PEM file name, which must be a regular file of at most
// maxPEMBytes: a URL naming a device or a pipe (/dev/zero, a FIFO) must not
// make parsing it read for ever or wait for a writer.
func readPEM(name string) ([]byte, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	b, err := io.ReadAll(io.LimitReader(f, maxPEMBytes+1))
	if err == nil && len(b) > maxPEMBytes {
		err = fmt.Errorf("larger than %d bytes", maxPEMBytes)
	}
	return b, err
}
