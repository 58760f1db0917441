package main

// The `certs` subcommand: everything the control plane needs for TLS and identities, made here so the
// Python side needs no crypto library. ECDSA P-256 keys: fast to generate and accepted by every
// component (the service-account signer then issues ES256 tokens).
//
// Files written to --dir:
//
//	ca.crt ca.key                        the cluster CA (client-ca, root-ca, cluster signing)
//	apiserver.crt apiserver.key          serving cert for --hosts and the in-cluster service names
//	admin.crt admin.key                  client cert CN=plrl-admin, O=system:masters
//	controller-manager.crt/.key          CN=system:kube-controller-manager
//	scheduler.crt scheduler.key          CN=system:kube-scheduler
//	sa.key sa.pub                        the service-account token signing key pair

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

type identity struct {
	file string
	cn   string
	orgs []string
}

// The clients the control plane's own components and the test admin use.
var clients = []identity{
	{"admin", "plrl-admin", []string{"system:masters"}},
	{"controller-manager", "system:kube-controller-manager", nil},
	{"scheduler", "system:kube-scheduler", nil},
}

func runCerts(args []string) int {
	fs := flag.NewFlagSet("certs", flag.ContinueOnError)
	dir := fs.String("dir", "", "directory to write the certificates and keys to (created)")
	hosts := fs.String("hosts", "127.0.0.1,localhost", "comma-separated IPs and DNS names for the apiserver cert")
	serviceIP := fs.String("service-ip", "10.0.0.1", "the ClusterIP of the default/kubernetes Service")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "certs: --dir is required")
		return 2
	}
	if err := writeAll(*dir, strings.Split(*hosts, ","), *serviceIP); err != nil {
		fmt.Fprintf(os.Stderr, "certs: %v\n", err)
		return 1
	}
	return 0
}

func writeAll(dir string, hosts []string, serviceIP string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	caKey, err := newKey()
	if err != nil {
		return err
	}
	caTmpl := template(pkix.Name{CommonName: "plrl-local-ca"})
	caTmpl.IsCA = true
	caTmpl.BasicConstraintsValid = true
	caTmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := writePair(dir, "ca", caDER, caKey); err != nil {
		return err
	}

	serving := template(pkix.Name{CommonName: "kube-apiserver"})
	serving.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	serving.DNSNames = []string{
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
	}
	for _, h := range append(hosts, serviceIP) {
		if ip := net.ParseIP(strings.TrimSpace(h)); ip != nil {
			serving.IPAddresses = append(serving.IPAddresses, ip)
		} else if h = strings.TrimSpace(h); h != "" {
			serving.DNSNames = append(serving.DNSNames, h)
		}
	}
	if err := issue(dir, "apiserver", serving, ca, caKey); err != nil {
		return err
	}
	for _, c := range clients {
		t := template(pkix.Name{CommonName: c.cn, Organization: c.orgs})
		t.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		if err := issue(dir, c.file, t, ca, caKey); err != nil {
			return err
		}
	}

	saKey, err := newKey()
	if err != nil {
		return err
	}
	if err := writeKey(filepath.Join(dir, "sa.key"), saKey); err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return err
	}
	return writePEM(filepath.Join(dir, "sa.pub"), "PUBLIC KEY", pub)
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func template(subject pkix.Name) *x509.Certificate {
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      subject,
		// Back-dated so small clock differences between processes never make a fresh cert "not yet valid".
		NotBefore: now.Add(-time.Hour),
		NotAfter:  now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:  x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
	}
}

func issue(dir, name string, t, ca *x509.Certificate, caKey crypto.Signer) error {
	key, err := newKey()
	if err != nil {
		return err
	}
	der, err := x509.CreateCertificate(rand.Reader, t, ca, key.Public(), caKey)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return writePair(dir, name, der, key)
}

func writePair(dir, name string, der []byte, key *ecdsa.PrivateKey) error {
	if err := writePEM(filepath.Join(dir, name+".crt"), "CERTIFICATE", der); err != nil {
		return err
	}
	return writeKey(filepath.Join(dir, name+".key"), key)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der)
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}
