package testkit

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a CA with a server certificate for 127.0.0.1 and a client
// certificate, as PEM files in a temporary directory.
type PKI struct {
	Dir    string
	CAPool *x509.CertPool
	// ServerCert and ServerKey are the server's, for 127.0.0.1; ClientCA
	// is the certificate of the authority that issued them and ClientCert
	// with ClientKey; OtherCA is an authority that issued nothing.
	ServerCert, ServerKey, ClientCA, ClientCert, ClientKey string
	OtherCA                                                string
}

// NewPKI writes a new PKI to a temporary directory of t.
func NewPKI(t testing.TB) PKI {
	t.Helper()
	dir := t.TempDir()
	p := PKI{Dir: dir, CAPool: x509.NewCertPool()}
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		WriteFile(t, path, string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})))
		return path
	}
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	serial := int64(1)
	now := time.Now()
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, string) {
		key := newKey()
		serial++
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
			KeyUsage: x509.KeyUsageCertSign}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		cert, _ := x509.ParseCertificate(der)
		return cert, key, write(name+".pem", "CERTIFICATE", der)
	}
	ca, caKey, caPath := newCA("test-ca")
	p.CAPool.AddCert(ca)
	p.ClientCA = caPath
	_, _, p.OtherCA = newCA("other-ca")
	leaf := func(name string, usage x509.ExtKeyUsage, ips []net.IP) (string, string) {
		key := newKey()
		serial++
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IPAddresses: ips,
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kder)
	}
	p.ServerCert, p.ServerKey = leaf("server", x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)})
	p.ClientCert, p.ClientKey = leaf("client", x509.ExtKeyUsageClientAuth, nil)
	return p
}

// ClientTLS returns a client's TLS configuration trusting the CA, with the
// client certificate when withCert.
func (p PKI) ClientTLS(t testing.TB, withCert bool) *tls.Config {
	cfg := &tls.Config{RootCAs: p.CAPool, MinVersion: tls.VersionTLS12}
	if withCert {
		pair, err := tls.LoadX509KeyPair(p.ClientCert, p.ClientKey)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}
