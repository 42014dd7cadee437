package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// tlsFiles are --tls-ca, --tls-cert and --tls-key, also kept in a saved
// context. Any of them turns TLS on.
type tlsFiles struct {
	CA   string `json:"tls_ca,omitempty"`
	Cert string `json:"tls_cert,omitempty"`
	Key  string `json:"tls_key,omitempty"`
}

// tlsFlagNames are the flags of tlsFiles, in its order.
var tlsFlagNames = [3]string{"tls-ca", "tls-cert", "tls-key"}

func (f *tlsFiles) fields() [3]*string { return [3]*string{&f.CA, &f.Cert, &f.Key} }

// fillFrom sets the files the command line did not give from saved.
func (f *tlsFiles) fillFrom(saved tlsFiles, given map[string]bool) {
	from := saved.fields()
	for i, p := range f.fields() {
		if !given[tlsFlagNames[i]] && *from[i] != "" {
			*p = *from[i]
		}
	}
}

// given keeps the files the command line gave, as absolute paths, for
// context add.
func (f tlsFiles) given(given map[string]bool) (tlsFiles, error) {
	var out tlsFiles
	to := out.fields()
	for i, p := range f.fields() {
		if given[tlsFlagNames[i]] {
			abs, err := filepath.Abs(*p)
			if err != nil {
				return out, fmt.Errorf("--%s: %w", tlsFlagNames[i], err)
			}
			*to[i] = abs
		}
	}
	return out, nil
}

// config is the client's TLS configuration: nil (plaintext) when no file
// is given; else brokers verified against the CA file (the system's roots
// without one) and the client certificate presented when given.
func (f tlsFiles) config() (*tls.Config, error) {
	if f == (tlsFiles{}) {
		return nil, nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		conf.RootCAs = x509.NewCertPool()
		if !conf.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", f.CA)
		}
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	if f.Cert != "" {
		cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert, --tls-key: %w", err)
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	return conf, nil
}
