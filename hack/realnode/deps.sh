#!/usr/bin/env bash
# Install the Debian packages the real node needs, only those missing (Debian 12 names).
set -euo pipefail
packages=(containerd runc containernetworking-plugins debootstrap docker.io iptables conntrack
  socat gcc libc6-dev openssl iproute2)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[realnode] apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
