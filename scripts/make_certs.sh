#!/usr/bin/env bash
# Creates a development cluster CA and the certificates Loom's mutual TLS
# needs (docs/security.md):
#   scripts/make_certs.sh OUT_DIR [--node=NAME]... [--user=NAME]... [--host=DNS_OR_IP]...
# OUT_DIR/ca/{ca.crt,ca.key}: the CA (keep ca.key off the cluster).
# One directory per identity, each with ca.crt, tls.crt, tls.key (the
# Kubernetes / cert-manager Secret layout, what --tls_dir reads):
#   coordinator/   server and client certificate; SANs localhost, 127.0.0.1 and every --host
#   node-NAME/     a node agent; its node id is NAME
#   admin/         the admin credential (loomctl)
#   user-NAME/     a user
# The role is the subject's OU (coordinator | node | admin | user), the name its CN.
# Re-running with the same OUT_DIR keeps the CA and every identity that
# exists and adds the missing ones; delete an identity's directory to reissue it.
set -euo pipefail

usage() {
  echo "usage: scripts/make_certs.sh OUT_DIR [--node=NAME]... [--user=NAME]... [--host=DNS_OR_IP]... [--days=N]" >&2
  exit 2
}

[ $# -ge 1 ] || usage
out="$1"
shift
case "$out" in -*) usage ;; esac
nodes=()
users=()
hosts=()
days=365
for arg in "$@"; do
  case "$arg" in
    --node=*) nodes+=("${arg#--node=}") ;;
    --user=*) users+=("${arg#--user=}") ;;
    --host=*) hosts+=("${arg#--host=}") ;;
    --days=*) days="${arg#--days=}" ;;
    *) echo "make_certs: unknown argument '$arg'" >&2; usage ;;
  esac
done
valid_name() { [[ "$1" =~ ^[A-Za-z0-9._-]{1,64}$ ]]; }
for name in "${nodes[@]+"${nodes[@]}"}" "${users[@]+"${users[@]}"}"; do
  valid_name "$name" || { echo "make_certs: name '$name' must be 1 to 64 characters of [A-Za-z0-9._-]" >&2; exit 2; }
done
[[ "$days" =~ ^[0-9]+$ ]] || { echo "make_certs: --days must be a number" >&2; exit 2; }
command -v openssl >/dev/null || { echo "make_certs: openssl not found (scripts/install_deps.sh)" >&2; exit 1; }

umask 077
mkdir -p "$out/ca"
ca_key="$out/ca/ca.key"
ca_crt="$out/ca/ca.crt"
if [ ! -f "$ca_crt" ]; then
  openssl ecparam -name prime256v1 -genkey -noout -out "$ca_key" 2>/dev/null
  openssl req -x509 -new -key "$ca_key" -sha256 -days 3650 -subj "/O=loom/OU=ca/CN=loom-cluster-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$ca_crt" 2>/dev/null
  echo "make_certs: created CA $ca_crt"
fi

# issue DIR ROLE NAME EXTENDED_KEY_USAGE [SUBJECT_ALT_NAMES]
issue() {
  local dir="$1" role="$2" name="$3" eku="$4" san="${5:-}"
  if [ -f "$dir/tls.crt" ]; then
    echo "make_certs: keeping $dir"
    return
  fi
  mkdir -p "$dir"
  local ext
  ext="$(mktemp)"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    [ -n "$san" ] && echo "subjectAltName=$san"
  } > "$ext"
  openssl ecparam -name prime256v1 -genkey -noout -out "$dir/tls.key" 2>/dev/null
  openssl req -new -key "$dir/tls.key" -subj "/O=loom/OU=$role/CN=$name" -out "$dir/tls.csr" 2>/dev/null
  openssl x509 -req -in "$dir/tls.csr" -CA "$ca_crt" -CAkey "$ca_key" -CAcreateserial \
    -CAserial "$out/ca/ca.srl" -days "$days" -sha256 -extfile "$ext" -out "$dir/tls.crt" 2>/dev/null
  rm -f "$dir/tls.csr" "$ext"
  cp "$ca_crt" "$dir/ca.crt"
  chmod 600 "$dir/tls.key"
  chmod 644 "$dir/tls.crt" "$dir/ca.crt"
  echo "make_certs: $dir ($role $name)"
}

san="DNS:localhost,IP:127.0.0.1"
for host in "${hosts[@]+"${hosts[@]}"}"; do
  if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then
    san="$san,IP:$host"
  else
    san="$san,DNS:$host"
  fi
done
issue "$out/coordinator" coordinator loom-coordinator "serverAuth,clientAuth" "$san"
issue "$out/admin" admin admin clientAuth
for name in "${nodes[@]+"${nodes[@]}"}"; do issue "$out/node-$name" node "$name" clientAuth; done
for name in "${users[@]+"${users[@]}"}"; do issue "$out/user-$name" user "$name" clientAuth; done
