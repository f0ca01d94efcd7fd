package kafka

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// selfSigned writes a CA-less self-signed certificate for 127.0.0.1 and
// returns the server TLS config and the PEM file path to trust.
func selfSigned(t *testing.T) (*tls.Config, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kfake"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:              []string{"localhost"},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, ca
}

// TestURLPassesTLSAndSASL opens a sink and a source by URL on a broker that
// requires TLS and SASL/SCRAM, and checks that a wrong password fails without
// appearing in the error.
func TestURLPassesTLSAndSASL(t *testing.T) {
	t.Parallel()
	srvTLS, ca := selfSigned(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(srvTLS), kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-512", "ackwise", "s3cret-pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	addr := c.ListenAddrs()[0]
	topic := uniq("sec")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	base := "kafka://ackwise:s3cret-pw@" + addr + "/" + topic + "?sasl=scram-sha-512&tls_ca=" + ca
	u, err := parseURLString(base)
	if err != nil {
		t.Fatal(err)
	}
	if err := CreateTopics(ctx, u, 1, 1); err != nil {
		t.Fatal(err)
	}
	sink, err := adapters.OpenSink(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	if err := sink.Publish(ctx, &ackwise.Message{ID: "secure-1", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	src, err := adapters.OpenSource(ctx, base+"&group=g")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if m := receiveN(t, src, 1)[0]; m.ID != "secure-1" {
		t.Fatalf("got %+v", m)
	}

	bad := strings.Replace(base, "s3cret-pw", "wrong-pw", 1)
	bctx, bcancel := context.WithTimeout(ctx, 5*time.Second)
	defer bcancel()
	_, err = adapters.OpenSink(bctx, bad)
	if err == nil {
		t.Fatal("wrong password accepted")
	}
	t.Logf("wrong password: %v", err)
	if strings.Contains(err.Error(), "wrong-pw") || strings.Contains(err.Error(), "s3cret-pw") {
		t.Fatalf("error leaks the password: %v", err)
	}
	// Without the CA the server certificate is not trusted.
	_, err = adapters.OpenSink(bctx, strings.Replace(base, "tls_ca="+ca, "tls=true", 1))
	t.Logf("untrusted certificate: %v", err)
	var uerr x509.UnknownAuthorityError
	if err == nil || !(errors.As(err, &uerr) || strings.Contains(err.Error(), "certificate")) {
		t.Fatalf("untrusted server certificate: %v", err)
	}
}

func parseURLString(raw string) (SourceConfig, error) {
	u, err := parseRaw(raw)
	if err != nil {
		return SourceConfig{}, err
	}
	return ParseURL(u)
}

func parseRaw(raw string) (*url.URL, error) { return url.Parse(raw) }
