#!/usr/bin/env bash
# controlplane.sh builds the local control-plane binaries that envtest, the
# end-to-end suite and `make demo` run: kube-apiserver, kube-controller-manager
# and kube-scheduler (k8s.io/kubernetes), etcd, kwok and kwokctl.
#
# Everything is built from source fetched through the Go module proxy; no
# release download site is contacted (none is reachable where this runs).
# The binaries land in a versioned cache outside the repository so that CI,
# later runs and other checkouts reuse them:
#
#   ${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}/k8s-v<K8S_VERSION>/
#
# Idempotent: a binary that already exists (and answers --version) is not
# rebuilt, so a warm run takes a second or two. Prints the directory on the
# last line of stdout, so callers can do `ASSETS=$(hack/controlplane.sh | tail -1)`.
#
# `hack/controlplane.sh node` also builds what a real node needs
# (hack/realnode.sh): kubelet, kube-proxy and kubectl of the same version,
# crictl and helm (a copy of $HELM when set), into the same directory.
set -euo pipefail

with_node=false
case "${1:-}" in
  "") ;;
  node) with_node=true ;;
  *) echo "usage: $0 [node]" >&2; exit 2 ;;
esac

K8S_VERSION=${K8S_VERSION:-1.37.2}
STAGING_VERSION=${STAGING_VERSION:-0.${K8S_VERSION#1.}}
ETCD_VERSION=${ETCD_VERSION:-3.6.16}
KWOK_VERSION=${KWOK_VERSION:-0.8.0}
CRICTL_VERSION=${CRICTL_VERSION:-1.37.0}
HELM_VERSION=${HELM_VERSION:-3.22.0}

cache_root=${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}
bin_dir="$cache_root/k8s-v${K8S_VERSION}"
mkdir -p "$bin_dir"

log() { printf '[controlplane] %s\n' "$*" >&2; }
# Modules come only from the module proxy, never straight from VCS hosts.
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export GOTOOLCHAIN=local
case "${GOPROXY:-}" in *direct*|"") export GOPROXY="$(go env GOPROXY | sed 's/,direct//; s/|direct//')";; esac

# Throwaway module directories, removed when the script exits.
scratch=()
trap 'rm -rf "${scratch[@]}"' EXIT
mkscratch() { SCRATCH=$(mktemp -d); scratch+=("$SCRATCH"); }

# The binaries are stripped (-ldflags -s -w), so the compiler need not write
# the DWARF the linker drops: about 10% less compile time (k8s.io/api on 2
# cores: 172 s of CPU with DWARF, 155 s without).
export GOFLAGS="$GOFLAGS -gcflags=all=-dwarf=false"

have() { [ -x "$bin_dir/$1" ] && "$bin_dir/$1" --version >/dev/null 2>&1; }

timed() {
  local what=$1; shift
  local start=$SECONDS
  log "building $what"
  "$@"
  log "built $what in $((SECONDS - start))s"
}

# build_kubernetes [--kwok] CMD… builds the named commands of
# k8s.io/kubernetes (cmd/<name>). With --kwok it builds kwok and kwokctl in
# the same module afterwards: their Kubernetes libraries are then the
# control plane's (v0.<minor>.<patch> of K8S_VERSION, where kwok's own
# go.mod asks for older ones), already compiled for the commands, which
# makes kwok's cold build a fraction of a separate one. Adding kwok to the
# module moves none of the commands' dependencies.
build_kubernetes() {
  local with_kwok=false
  if [ "${1:-}" = --kwok ]; then with_kwok=true; shift; fi
  mkscratch
  local work=$SCRATCH
  # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them
  # with ./staging paths; a consumer must replace each with the published
  # k8s.io/<name> v0.<minor>.<patch> module instead. The list comes from the
  # kubernetes go.mod itself, so a new staging module needs no change here.
  local modfile
  modfile=$(cd "$work" && go mod download -json "k8s.io/kubernetes@v${K8S_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
  [ -f "$modfile" ] || { log "cannot find go.mod of k8s.io/kubernetes v${K8S_VERSION}"; return 1; }
  # With --kwok the module always holds the control plane's commands, built
  # or not, so that kwok gets the same dependencies either way.
  local imports=("$@")
  if $with_kwok; then imports=(kube-apiserver kube-controller-manager kube-scheduler); fi
  {
    echo "module gpuhealth.local/controlplane"
    echo
    echo "go $(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')"
    echo
    echo "require k8s.io/kubernetes v${K8S_VERSION}"
    if $with_kwok; then echo "require sigs.k8s.io/kwok v${KWOK_VERSION}"; fi
    echo
    echo "replace ("
    grep -E '^[[:space:]]*k8s.io/[A-Za-z0-9._-]+ => \./staging/' "$modfile" \
      | awk -v v="v${STAGING_VERSION}" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } >"$work/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for cmd in "${imports[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$cmd"; done
    if $with_kwok; then printf '\t_ "sigs.k8s.io/kwok/cmd/kwok"\n\t_ "sigs.k8s.io/kwok/cmd/kwokctl"\n'; fi
    printf ')\n'
  } >"$work/tools.go"
  (cd "$work" && go mod tidy -e >/dev/null 2>&1 || true)
  if [ $# -gt 0 ]; then
    local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v${K8S_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${K8S_VERSION#1.}"
    ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=v${K8S_VERSION}"
    # One go build for all of them shares the compile of their common packages.
    local pkgs=()
    for cmd in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$cmd"); done
    (cd "$work" && CGO_ENABLED=0 go build -tags tools -trimpath -ldflags "$ldflags" -o "$bin_dir/" "${pkgs[@]}")
  fi
  if $with_kwok; then
    # A go build of its own: the commands' version stamps stay out of kwok.
    (cd "$work" && CGO_ENABLED=0 go build -tags tools -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=v${KWOK_VERSION}" \
      -o "$bin_dir/" sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl)
  fi
}

build_etcd() {
  mkscratch
  local work=$SCRATCH
  cat >"$work/main.go" <<'GO'
// Command etcd is the etcd server, built from go.etcd.io/etcd/server/v3.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  printf 'module gpuhealth.local/etcd\n\ngo %s\n\nrequire go.etcd.io/etcd/server/v3 v%s\n' \
    "$(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')" "$ETCD_VERSION" >"$work/go.mod"
  (cd "$work" && go mod tidy >/dev/null && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin_dir/etcd" .)
}

total=$SECONDS
kube_cached=false kwok_cached=false
if have kube-apiserver && have kube-controller-manager && have kube-scheduler; then
  kube_cached=true
  log "kube-apiserver, kube-controller-manager, kube-scheduler v${K8S_VERSION}: cached"
fi
if have kwok && have kwokctl; then kwok_cached=true; log "kwok, kwokctl v${KWOK_VERSION}: cached"; fi
if ! $kube_cached && ! $kwok_cached; then
  timed "kube-apiserver, kube-controller-manager, kube-scheduler v${K8S_VERSION}, then kwok, kwokctl v${KWOK_VERSION} (cold: ~15 min on 2 cores)" \
    build_kubernetes --kwok kube-apiserver kube-controller-manager kube-scheduler
elif ! $kube_cached; then
  timed "kube-apiserver, kube-controller-manager, kube-scheduler v${K8S_VERSION} (cold: ~15 min on 2 cores)" \
    build_kubernetes kube-apiserver kube-controller-manager kube-scheduler
elif ! $kwok_cached; then
  timed "kwok, kwokctl v${KWOK_VERSION}" build_kubernetes --kwok
fi
if have etcd; then log "etcd v${ETCD_VERSION}: cached"; else timed "etcd v${ETCD_VERSION}" build_etcd; fi
if $with_node; then
  if have kubelet && have kube-proxy && [ -x "$bin_dir/kubectl" ] && "$bin_dir/kubectl" version --client >/dev/null 2>&1; then
    log "kubelet, kube-proxy, kubectl v${K8S_VERSION}: cached"
  else
    timed "kubelet, kube-proxy, kubectl v${K8S_VERSION} (~2 min with a warm Go cache)" build_kubernetes kubelet kube-proxy kubectl
  fi
  if [ -x "$bin_dir/crictl" ] && "$bin_dir/crictl" --version >/dev/null 2>&1; then log "crictl v${CRICTL_VERSION}: cached"; else
    timed "crictl v${CRICTL_VERSION}" env CGO_ENABLED=0 GOBIN="$bin_dir" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/cri-tools/cmd/crictl@v${CRICTL_VERSION}"
  fi
  if [ -x "$bin_dir/helm" ] && "$bin_dir/helm" version >/dev/null 2>&1; then log "helm v${HELM_VERSION}: cached"
  elif [ -x "${HELM:-}" ] && "$HELM" version >/dev/null 2>&1; then
    # The Makefile's own helm (./bin/helm-<version>), instead of a second build.
    cp "$HELM" "$bin_dir/helm" && log "helm: copied $HELM"
  else
    timed "helm v${HELM_VERSION}" env CGO_ENABLED=0 GOBIN="$bin_dir" go install -trimpath "helm.sh/helm/v3/cmd/helm@v${HELM_VERSION}"
  fi
fi
log "control plane ready in $bin_dir ($((SECONDS - total))s)"
echo "$bin_dir"
