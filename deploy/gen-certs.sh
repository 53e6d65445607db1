#!/usr/bin/env bash
# gen-certs.sh DIR N — a cluster CA and N host certificates for meshrun.
# Writes DIR/ca.pem, DIR/ca.key and DIR/host<i>.pem, DIR/host<i>.key for
# i in 0..N-1: ECDSA P-256, CN and DNS SAN "meshrun-host-<i>" (the identity
# every link pins), serverAuth + clientAuth, valid 365 days. Keys are 0600.
# Copy ca.pem and each host's own pair to that host's certs_dir.
set -euo pipefail
if [ $# -ne 2 ] || ! [[ "$2" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 DIR N" >&2
  exit 2
fi
dir=$1 n=$2
mkdir -p "$dir"
umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

openssl ecparam -name prime256v1 -genkey -noout -out "$dir/ca.key"
openssl req -x509 -new -key "$dir/ca.key" -sha256 -days 365 \
  -subj "/O=meshrun/CN=meshrun cluster ca" \
  -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out "$dir/ca.pem" 2>/dev/null

for ((i = 0; i < n; i++)); do
  cn="meshrun-host-$i"
  openssl ecparam -name prime256v1 -genkey -noout -out "$dir/host$i.key"
  openssl req -new -key "$dir/host$i.key" -subj "/O=meshrun/CN=$cn" -out "$tmp/host$i.csr"
  cat > "$tmp/host$i.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:$cn
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid:always
EXT
  openssl x509 -req -in "$tmp/host$i.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -CAserial "$tmp/ca.srl" -days 365 -sha256 \
    -extfile "$tmp/host$i.ext" -out "$dir/host$i.pem" 2>/dev/null
done
chmod 644 "$dir"/*.pem
echo "wrote $dir: ca.pem and $n host certificates"
