# Shared settings of `make e2e-kind` (sourced by the scripts in hack/kind and hack/e2e-kind.sh).
# kind runs its nodes in a Docker engine of its own (own socket and data root, so the real
# node's engine and its images are left alone); the node image is built here from Debian's
# archive and the project's own binaries, no registry involved.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=../versions.env
source "$ROOT/hack/versions.env"
CACHE=${MESHRUN_CACHE:-$HOME/.cache/meshrun}
BIN=$ROOT/.cluster/bin
KIND_DOCKER_DIR=/run/meshrun-kind-docker
KIND_DOCKER_SOCK=$KIND_DOCKER_DIR/docker.sock
KIND_DOCKER_ROOT=$CACHE/kind-docker-root
# The node image: Debian bookworm (its systemd 252 still boots on cgroup v1), containerd, runc
# and the CNI plugins from Debian, Kubernetes from the project's builds; tagged by what it holds.
KIND_BASE_IMAGE=meshrun.local/kind-base:bookworm
KIND_NODE_IMAGE_LOCAL=meshrun.local/kind-node:$KUBE_VERSION
# The real node's engine, where hack/realnode/images.sh builds the operator and trainer images.
REALNODE_DOCKER_HOST=unix:///run/meshrun-docker/docker.sock
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

LOG_TAG=${LOG_TAG:-kind}
# shellcheck source=../lib.sh
source "$ROOT/hack/lib.sh"

# kind_docker ARGS...: docker on kind's engine.
kind_docker() { DOCKER_HOST=unix://$KIND_DOCKER_SOCK docker "$@"; }

# ensure_kind_docker: start kind's engine unless it runs. Privileged containers (kind's nodes)
# go through hack/kind/runc-bounded, which drops capabilities this machine's bounding set lacks.
# No iptables changes (the real node's FORWARD rules stay as they are); published ports go
# through docker-proxy, and nothing needs to leave the machine.
ensure_kind_docker() {
  kind_docker version >/dev/null 2>&1 && return
  log "starting kind's Docker engine on $KIND_DOCKER_SOCK"
  mkdir -p "$KIND_DOCKER_DIR" "$KIND_DOCKER_ROOT"
  # The engine outlives this checkout's scripts only as long as its wrapper does: a copy.
  install -m 0755 "$ROOT/hack/kind/runc-bounded" "$KIND_DOCKER_DIR/runc-bounded"
  setsid dockerd --host "unix://$KIND_DOCKER_SOCK" --data-root "$KIND_DOCKER_ROOT" \
    --exec-root "$KIND_DOCKER_DIR/exec" --pidfile "$KIND_DOCKER_DIR/dockerd.pid" \
    --bridge=none --iptables=false --ip-masq=false --ip-forward=false \
    --add-runtime "bounded-runc=$KIND_DOCKER_DIR/runc-bounded" --default-runtime bounded-runc \
    >>"$CACHE/kind-dockerd.log" 2>&1 </dev/null &
  wait_for "kind's Docker engine" 60 kind_docker version
}

stop_kind_docker() {
  local pid
  [[ -s $KIND_DOCKER_DIR/dockerd.pid ]] || return 0
  pid=$(cat "$KIND_DOCKER_DIR/dockerd.pid")
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  umount "$KIND_DOCKER_ROOT" 2>/dev/null || true
}
