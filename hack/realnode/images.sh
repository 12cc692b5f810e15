#!/usr/bin/env bash
# Images without a registry to pull from: nothing comes from outside this machine. A Docker
# engine of our own (own socket and data root, no bridge, no iptables changes) turns local root
# filesystems into images; a registry of our own on 127.0.0.1 (CNCF distribution, built by
# hack/build-tools.sh) carries them into the real node's containerd: `docker push` sends only
# the layers the registry lacks and `ctr pull` fetches only those containerd lacks, so a code
# change moves one layer of a few MB instead of `docker save | ctr import` of the whole 5 GB
# trainer image (4-6 minutes on two cores).
#
#   hack/realnode/images.sh node                  pause + base image, imported into containerd
#   hack/realnode/images.sh build TARGET TAG [--no-import]
#                                                 docker build --target TARGET of the Dockerfile
#                                                 on the base image, imported into containerd
#   hack/realnode/images.sh prepare               the engine and the base images only
#   hack/realnode/images.sh stop-docker           stop the Docker engine and the registry started here
set -euo pipefail
source "$(dirname "$0")/common.sh"
DOCKER_SOCK=/run/meshrun-docker/docker.sock
export DOCKER_HOST=unix://$DOCKER_SOCK
# Docker speaks plain HTTP to registries on 127.0.0.0/8 without being told; ctr with --plain-http.
REGISTRY=127.0.0.1:${MESHRUN_REGISTRY_PORT:-5117}
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

registry_up() { curl -fsS "http://$REGISTRY/v2/" >/dev/null 2>&1; }

ensure_registry() {
  registry_up && return
  [[ -x $BIN/registry ]] || "$ROOT/hack/build-tools.sh" registry
  log "starting an image registry on $REGISTRY"
  mkdir -p "$CACHE/registry-root"
  cat >"$RN/registry.yml" <<YAML
version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage:
  filesystem: {rootdirectory: $CACHE/registry-root}
  delete: {enabled: true}
http: {addr: $REGISTRY, secret: meshrun-local-only}
YAML
  # No OpenTelemetry exporter: nothing listens for its traces here.
  start_daemon registry env OTEL_TRACES_EXPORTER=none "$BIN/registry" serve "$RN/registry.yml"
  wait_for "the image registry" 30 registry_up
}

stop_docker() {
  stop_daemon registry
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
  # containerd stores Docker Hub style names in full (meshrun/x -> docker.io/meshrun/x).
  local full=$name first=${name%%/*}
  if [[ $name != */* ]]; then
    full=docker.io/library/$name
  elif [[ $first != *.* && $first != *:* && $first != localhost ]]; then
    full=docker.io/$name
  fi
  if [[ $(cat "$marker" 2>/dev/null) == "$id" ]] && ctr_k8s images ls -q "name==$full" | grep -q .; then
    return 0
  fi
  log "importing $name into containerd"
  local remote=$REGISTRY/$name
  docker tag "$name" "$remote"
  docker push -q "$remote" >/dev/null
  ctr_k8s images pull --plain-http "$remote" >/dev/null
  ctr_k8s images tag --force "$remote" "$full" >/dev/null
  ctr_k8s images rm "$remote" >/dev/null
  # The registry keeps the pushed tag only: older manifests and the layers only they used go.
  "$BIN/registry" garbage-collect --delete-untagged "$RN/registry.yml" >/dev/null 2>&1 || true
  mkdir -p "$(dirname "$marker")"
  echo "$id" >"$marker"
  drop_stale_id_refs
  log "imported $name ($((SECONDS - t0)) s)"
}

# The CRI plugin names every image also by its id (sha256:...); such a name outlives a re-tag
# and pins the old image (5 GB for the trainer). Drop id names no tagged image shares.
drop_stale_id_refs() {
  local listing live ref digest
  listing=$(ctr_k8s images ls 2>/dev/null | awk 'NR > 1 {print $1, $3}')
  live=$(awk '$1 !~ /^sha256:/ {print $2}' <<<"$listing" | sort -u)
  while read -r ref digest; do
    [[ $ref == sha256:* ]] || continue
    grep -qxF "$digest" <<<"$live" || ctr_k8s images rm "$ref" >/dev/null 2>&1 || true
  done <<<"$listing"
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
    -c 'ENV LANG=C.UTF-8' -c 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    -c 'CMD ["/bin/bash"]' "$tarball" "$BASE_IMAGE-rootfs" >/dev/null
  # The certificate authorities this machine trusts beyond Debian's (an egress proxy's, for
  # example) go into a second layer, so pip inside image builds trusts what the host trusts.
  local ca_dir=/usr/local/share/ca-certificates work
  work=$(mktemp -d)
  mkdir -p "$work/ca"
  find "$ca_dir" -name '*.crt' -exec cp {} "$work/ca/" \; 2>/dev/null || true
  printf 'FROM %s\nCOPY ca/ %s/\nRUN update-ca-certificates >/dev/null\n' \
    "$BASE_IMAGE-rootfs" "$ca_dir" >"$work/Dockerfile"
  docker build -q -t "$BASE_IMAGE" "$work" >/dev/null
  rm -rf "$work"
}

# The Dockerfile starts FROM python:3.11-slim, which cannot be pulled here. Our base image is the
# same distribution (Debian bookworm) with the same Python minor (3.11) and `python`/`pip` first
# on PATH, so it stands in under that name inside this private engine only (never pushed).
provide_from_images() {
  local ref
  for ref in $(awk 'toupper($1) == "FROM" {print $2}' "$ROOT/Dockerfile" | sort -u); do
    grep -qiE "^FROM[[:space:]]+[^[:space:]]+[[:space:]]+AS[[:space:]]+$ref\$" "$ROOT/Dockerfile" && continue
    case $ref in
      # Always re-tagged, so the alias follows a rebuilt base image.
      python:3.11-slim | python:3.11-slim-bookworm) docker tag "$BASE_IMAGE" "$ref" ;;
      *)
        docker image inspect "$ref" >/dev/null 2>&1 && continue
        log "the Dockerfile needs $ref, which cannot be pulled here"; return 1 ;;
    esac
  done
}

build_target() {
  local target=$1 tag=$2
  log "docker build --target $target -t $tag (base $BASE_IMAGE)"
  local t0=$SECONDS
  # The Dockerfile's steps are shown as they start (progress); the full output goes to the log.
  if ! docker build --network host --target "$target" -t "$tag" \
    ${TORCH_INDEX:+--build-arg "TORCH_INDEX=$TORCH_INDEX"} "$ROOT" 2>&1 \
    | tee "$RN/logs/build-$target.log" | { grep --line-buffered -E '^Step [0-9]+/' || true; } \
    | sed -u "s/^/  [$target] /"; then
    tail -30 "$RN/logs/build-$target.log"
    return 1
  fi
  # Each source change leaves the previous image (5 GB for the trainer) dangling: drop them.
  docker image prune -f >/dev/null
  log "built $tag ($((SECONDS - t0)) s)"
}

# prepare: the engine, the pause and base images, the Dockerfile's FROM image. Under a lock, so
# that up.sh and demo.sh may run it at the same time (one engine, one debootstrap).
prepare() {
  mkdir -p "$CACHE"
  exec 9>"$CACHE/images.lock"
  flock 9
  ensure_docker
  ensure_registry
  pause_image
  base_image
  provide_from_images
  flock -u 9
}

mkdir -p "$RN/logs"
case ${1:-} in
  prepare) prepare ;;
  node)
    prepare
    import_image "$PAUSE_IMAGE"
    import_image "$BASE_IMAGE"
    drop_stale_id_refs
    ;;
  build)
    prepare
    build_target "$2" "$3"
    [[ ${4:-} == --no-import ]] || import_image "$3"
    ;;
  stop-docker) stop_docker ;;
  *) echo "usage: $0 prepare | node | build TARGET TAG [--no-import] | stop-docker" >&2; exit 2 ;;
esac
