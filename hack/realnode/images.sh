#!/usr/bin/env bash
# Images without a registry: nothing is pulled. A Docker engine of our own (own socket and data
# root, no bridge, no iptables changes) turns local root filesystems into images, and
# `docker save | ctr import` moves them into the real node's containerd.
#
#   hack/realnode/images.sh node                  pause + base image, imported into containerd
#   hack/realnode/images.sh build TARGET TAG      docker build --target TARGET of the Dockerfile
#                                                 on the base image, imported into containerd
#   hack/realnode/images.sh stop-docker           stop the Docker engine started here
set -euo pipefail
source "$(dirname "$0")/common.sh"
DOCKER_SOCK=/run/meshrun-docker/docker.sock
export DOCKER_HOST=unix://$DOCKER_SOCK
# Debian bookworm from Debian's archive; python3 with a virtualenv at /opt/venv first on PATH so
# that `python` and `pip` behave as in the python:3.11-slim image (bookworm's python is 3.11);
# busybox gives the test pods nc, wget and nslookup.
BASE_PACKAGES=busybox,python3,python3-venv,python3-pip,ca-certificates
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

ensure_docker() {
  docker version >/dev/null 2>&1 && return
  log "starting a Docker engine on $DOCKER_SOCK"
  mkdir -p /run/meshrun-docker "$RN/logs"
  # --bridge=none/--iptables=false: builds use the host network and the engine leaves the
  # FORWARD chain alone (by default it sets the policy to DROP, which cuts the pod bridge off).
  setsid dockerd --host "unix://$DOCKER_SOCK" --data-root "$CACHE/docker-root" \
    --exec-root /run/meshrun-docker/exec --pidfile /run/meshrun-docker/dockerd.pid \
    --bridge=none --iptables=false --ip-masq=false --ip-forward=false \
    >>"$RN/logs/dockerd.log" 2>&1 </dev/null &
  wait_for "the Docker engine" 60 docker version
}

stop_docker() {
  local pid
  [[ -s /run/meshrun-docker/dockerd.pid ]] || return 0
  pid=$(cat /run/meshrun-docker/dockerd.pid)
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  # The engine bind-mounts its data root onto itself and may leave that mount behind.
  umount "$CACHE/docker-root" 2>/dev/null || true
}

# import_image NAME: copy a Docker image into the node's containerd unless the same image (by
# Docker image id, remembered in a marker file; containerd's CRI rewrites image labels) is
# already there.
import_image() {
  local name=$1 id t0=$SECONDS marker
  id=$(docker image inspect -f '{{.Id}}' "$name")
  marker=$CACHE/containerd-imported/${name//[\/:]/_}
  if [[ $(cat "$marker" 2>/dev/null) == "$id" ]] && ctr_k8s images ls -q "name==$name" | grep -q .; then
    return 0
  fi
  log "importing $name into containerd"
  docker save "$name" | ctr_k8s images import - >/dev/null
  mkdir -p "$(dirname "$marker")"
  echo "$id" >"$marker"
  log "imported $name ($((SECONDS - t0)) s)"
}

pause_image() {
  docker image inspect "$PAUSE_IMAGE" >/dev/null 2>&1 && return
  log "building $PAUSE_IMAGE from hack/realnode/pause.c"
  local work
  work=$(mktemp -d)
  gcc -static -Os -Wall -Wextra -o "$work/pause" "$ROOT/hack/realnode/pause.c"
  tar -C "$work" -c pause | docker import -c 'ENTRYPOINT ["/pause"]' - "$PAUSE_IMAGE" >/dev/null
  rm -rf "$work"
}

base_image() {
  docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 && return
  local tarball=$CACHE/rootfs-bookworm-${BASE_PACKAGES//,/-}.tar
  if [[ ! -s $tarball ]]; then
    log "debootstrap Debian bookworm ($BASE_PACKAGES); a few minutes"
    local t0=$SECONDS work
    work=$(mktemp -d)
    debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$work/rootfs" \
      "$DEBIAN_MIRROR" >"$RN/logs/debootstrap.log" 2>&1 \
      || { log "debootstrap failed, see $RN/logs/debootstrap.log"; return 1; }
    chroot "$work/rootfs" python3 -m venv /opt/venv
    chroot "$work/rootfs" apt-get clean
    rm -rf "$work/rootfs"/var/lib/apt/lists/* "$work/rootfs"/var/cache/apt/*.bin
    tar -C "$work/rootfs" --numeric-owner -cf "$tarball.partial" .
    mv "$tarball.partial" "$tarball"
    rm -rf "$work"
    echo $((SECONDS - t0)) >"$tarball.build-seconds"
    log "root filesystem ready ($((SECONDS - t0)) s)"
  fi
  docker import \
    -c 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/bash"]' "$tarball" "$BASE_IMAGE" >/dev/null
}

build_target() {
  local target=$1 tag=$2
  log "docker build --target $target -t $tag (base $BASE_IMAGE)"
  local t0=$SECONDS
  docker build --network host --target "$target" -t "$tag" \
    --build-arg "BASE_IMAGE=$BASE_IMAGE" ${TORCH_INDEX:+--build-arg "TORCH_INDEX=$TORCH_INDEX"} \
    "$ROOT" >"$RN/logs/build-$target.log" 2>&1 \
    || { tail -30 "$RN/logs/build-$target.log"; return 1; }
  log "built $tag ($((SECONDS - t0)) s)"
}

mkdir -p "$RN/logs"
case ${1:-} in
  node)
    ensure_docker
    pause_image
    base_image
    import_image "$PAUSE_IMAGE"
    import_image "$BASE_IMAGE"
    ;;
  build)
    ensure_docker
    base_image
    build_target "$2" "$3"
    import_image "$3"
    ;;
  stop-docker) stop_docker ;;
  *) echo "usage: $0 node | build TARGET TAG | stop-docker" >&2; exit 2 ;;
esac
