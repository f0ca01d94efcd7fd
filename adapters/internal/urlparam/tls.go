package urlparam

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// The TLS parameters [Query.TLS] reads. An adapter lists them in its table
// with [TLSParams].
const (
	TLSCA                 = "tls_ca"
	TLSCert               = "tls_cert"
	TLSKey                = "tls_key"
	TLSServerName         = "tls_server_name"
	TLSInsecureSkipVerify = "tls_insecure_skip_verify"
)

// TLSParamNames are the names of the TLS parameters, in table order.
var TLSParamNames = []string{TLSCA, TLSCert, TLSKey, TLSServerName, TLSInsecureSkipVerify}

// TLSParams returns the TLS parameters, for both sides, to list in an
// adapter's table.
func TLSParams() []Param {
	return []Param{
		{Name: TLSCA, Side: Both, Type: "file", Doc: "PEM file of the CA certificates to trust (default: the system's)"},
		{Name: TLSCert, Side: Both, Type: "file", Doc: "PEM file of the client certificate (with `tls_key`)"},
		{Name: TLSKey, Side: Both, Type: "file", Doc: "PEM file of the client key (with `tls_cert`)"},
		{Name: TLSServerName, Side: Both, Type: "string", Doc: "server name to verify (default: the host)"},
		{Name: TLSInsecureSkipVerify, Side: Both, Type: "bool", Doc: "true: do not verify the server (tests only)"},
	}
}

// TLS returns a TLS config (TLS 1.2 or later) from the TLS parameters the
// URL gives, or nil when it gives none (or an error came first). The
// PEM files must be regular files of at most 1 MiB: a URL naming a device
// or a pipe (/dev/zero, a FIFO) must not make parsing it read for ever or
// wait for a writer. tls_cert and tls_key go together.
func (q *Query) TLS() *tls.Config {
	if q.err != nil || q.First(TLSParamNames...) == "" {
		return nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	q.String(&c.ServerName, TLSServerName)
	q.Bool(&c.InsecureSkipVerify, TLSInsecureSkipVerify)
	if f, ok := q.get(TLSCA); ok {
		pem, err := readPEM(f)
		if err != nil {
			q.Fail(q.fileError(TLSCA, err))
			return nil
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			q.Fail(q.Errorf(TLSCA, "no PEM certificate in the file"))
			return nil
		}
		c.RootCAs = pool
	}
	if q.Has(TLSCert) != q.Has(TLSKey) {
		q.Fail(q.t.errorf("", "has one of %s= and %s=; give both or neither", TLSCert, TLSKey))
	}
	certF, ok := q.get(TLSCert)
	if !ok {
		return q.tlsOrNil(c)
	}
	keyF, _ := q.get(TLSKey)
	certPEM, err := readPEM(certF)
	if err != nil {
		q.Fail(q.fileError(TLSCert, err))
		return nil
	}
	keyPEM, err := readPEM(keyF)
	if err != nil {
		q.Fail(q.fileError(TLSKey, err))
		return nil
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		e := q.Errorf(TLSCert, "with %s = %q: not a certificate and its key", TLSKey, keyF)
		e.Err = err
		q.Fail(e)
		return nil
	}
	c.Certificates = []tls.Certificate{cert}
	return q.tlsOrNil(c)
}

func (q *Query) tlsOrNil(c *tls.Config) *tls.Config {
	if q.err != nil {
		return nil
	}
	return c
}

func (q *Query) fileError(name string, err error) *Error {
	e := q.Errorf(name, "cannot read it: %v", err)
	e.Err = err
	return e
}

// maxPEMBytes bounds a PEM file named in a URL.
const maxPEMBytes = 1 << 20

// readPEM reads the PEM file name, which must be a regular file of at most
// maxPEMBytes.
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
