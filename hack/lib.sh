# Shell helpers shared by the scripts under hack/ and by .ci/run: source this file, do not run it.
# Set before sourcing (each is read when a helper runs):
#   LOG_TAG          the tag of log lines: [TAG 12:34:56] message
#   KUBECTL          the kubectl binary kc runs (default: the local cluster's .cluster/bin/kubectl)
#   KUBECONFIG_FILE  the kubeconfig kc uses, or
#   KUBE_CONTEXT     a context of the default kubeconfig instead (kind clusters)
# shellcheck shell=bash

# log MESSAGE...: one timestamped, tagged line.
log() { printf '[%s %(%H:%M:%S)T] %s\n' "${LOG_TAG:-meshrun}" -1 "$*"; }

# die MESSAGE...: log "FAILED: MESSAGE" and exit 1.
die() {
  log "FAILED: $*"
  exit 1
}

# wait_for WHAT SECONDS CMD...: run CMD every half second until it succeeds; after SECONDS, log
# that it gave up waiting for WHAT and return 1.
wait_for() {
  local what=$1 limit=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "gave up after ${limit} s waiting for $what"; return 1
    fi
    sleep 0.5
  done
}

# kc ARGS...: kubectl on the calling script's cluster.
kc() {
  local kubectl=${KUBECTL:-$(dirname "${BASH_SOURCE[0]}")/../.cluster/bin/kubectl}
  if [[ -n ${KUBE_CONTEXT:-} ]]; then
    "$kubectl" --context "$KUBE_CONTEXT" "$@"
  else
    "$kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"
  fi
}

# Phases: the named, timed steps of a long script, and a table of their times at the end.
#   phase_begin NAME     print a heading and start timing NAME
#   phase_end [NOTE]     record how long NAME took (and NOTE) for phase_summary
#   phase_done MESSAGE   log MESSAGE with the seconds since the previous phase_done (or since
#                        sourcing): for scripts that only say when each step finished
#   phase_summary        print the recorded phases and the total time
PHASES=()
PHASE_NAME=""
PHASE_START=$SECONDS
SCRIPT_START=$SECONDS

_heading() {
  if [[ -t 1 ]]; then printf '\n\033[1m== %s\033[0m\n' "$1"; else printf '\n== %s\n' "$1"; fi
}

phase_begin() {
  _heading "$1"
  PHASE_NAME=$1
  PHASE_START=$SECONDS
}

phase_end() {
  PHASES+=("$(printf '%-44s %5d s%s' "$PHASE_NAME" $((SECONDS - PHASE_START)) "${1:+  $1}")")
}

phase_done() {
  log "$1 ($((SECONDS - PHASE_START)) s)"
  PHASE_START=$SECONDS
}

phase_summary() {
  _heading "time per phase"
  printf '  %s\n' "${PHASES[@]}"
  printf '  %-44s %5d s\n' total $((SECONDS - SCRIPT_START))
}
