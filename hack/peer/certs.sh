#!/usr/bin/env bash
# Certificates for running Kubeflow's training-operator as a plain process next to a local
# control plane (bench/operator_scale.py does this), made with openssl:
#
#   hack/peer/certs.sh webhook OUT          a CA and a serving certificate for the webhook
#   hack/peer/certs.sh client OUT USER PKI  a client certificate for USER (group system:masters)
#                                           signed by the cluster's CA in PKI (ca.crt, ca.key)
#
# training-operator refuses to start its controllers until its webhook certificates are valid:
# its cert rotator reads them from the Secret kubeflow/training-operator-webhook-cert, checks the
# CA (named training-operator-ca, as a DNS name), checks the serving certificate for
# training-operator.kubeflow.svc, and then waits for tls.crt in its certificate folder. The
# serving certificate also names 127.0.0.1, where the API server calls the webhook.
# Client certificates give each operator its own user name, so the API server's audit log tells
# their requests apart from everyone else's.
set -euo pipefail

webhook() {
  local out=$1
  mkdir -p "$out"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 \
    -keyout "$out/ca.key" -out "$out/ca.crt" \
    -subj "/O=training-operator/CN=training-operator-ca" \
    -addext "subjectAltName=DNS:training-operator-ca" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,digitalSignature,keyEncipherment" 2>/dev/null
  # The rotator parses the CA key as PKCS #1 only ("RSA PRIVATE KEY"), not openssl's PKCS #8.
  openssl rsa -in "$out/ca.key" -out "$out/ca.key" -traditional 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout "$out/tls.key" -out "$out/tls.csr" \
    -subj "/CN=training-operator.kubeflow.svc" 2>/dev/null
  openssl x509 -req -in "$out/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
    -CAcreateserial -days 365 -out "$out/tls.crt" -extfile <(
      echo "subjectAltName=DNS:training-operator.kubeflow.svc,IP:127.0.0.1"
      echo "extendedKeyUsage=serverAuth"
      echo "keyUsage=critical,digitalSignature,keyEncipherment"
    ) 2>/dev/null
  rm -f "$out/tls.csr" "$out/ca.srl"
}

client() {
  local out=$1 user=$2 pki=$3
  mkdir -p "$out"
  openssl req -newkey rsa:2048 -nodes -keyout "$out/$user.key" -out "$out/$user.csr" \
    -subj "/O=system:masters/CN=$user" 2>/dev/null
  openssl x509 -req -in "$out/$user.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -CAserial "$out/ca.srl" -days 30 -out "$out/$user.crt" \
    -extfile <(echo "extendedKeyUsage=clientAuth") 2>/dev/null
  rm -f "$out/$user.csr" "$out/ca.srl"
}

case ${1:-} in
  webhook) webhook "$2" ;;
  client) client "$2" "$3" "$4" ;;
  *) echo "usage: $0 webhook OUT | client OUT USER PKI" >&2; exit 2 ;;
esac
