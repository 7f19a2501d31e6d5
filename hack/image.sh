#!/usr/bin/env bash
# Builds gpuhealth's two images from the Dockerfile with podman (daemonless):
#   localhost/gpuhealth-operator:$IMAGE_TAG and localhost/gpuhealth-monitor:$IMAGE_TAG
# and prints their IDs and sizes.
#
# The Dockerfile's base images are ARGs defaulting to the public golang and
# distroless images. Where no registry is reachable (IMAGE_BASES=local, the
# default here), this script makes local stand-ins once and builds the same
# Dockerfile FROM them:
#   - a glibc base: Debian bookworm, debootstrap --variant=minbase (the
#     monitor's base, and the builder's);
#   - the builder: that base with gcc and libc6-dev, and the host's Go
#     toolchain and module cache mounted into the build;
#   - a static base: a root filesystem with only /etc/passwd and /etc/group
#     (nonroot = 65532) and /tmp (the operator's base).
# IMAGE_BASES=public builds FROM the Dockerfile's defaults instead.
#
# Installs podman, buildah, runc and debootstrap with apt-get when missing,
# runs containers with runc (crun refuses the hybrid cgroup hierarchy here);
# sets `default_ulimits = []` in /etc/containers/containers.conf (without it
# runc fails "error setting rlimit type 7" on these machines). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."

tag=${IMAGE_TAG:-dev}
bases=${IMAGE_BASES:-local}
cache=${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}/images
log() { echo "[image] $*" >&2; }
# timed WHAT CMD…: runs CMD and logs how long it took.
timed() {
  local what=$1 start=$SECONDS; shift
  "$@"
  log "$what: $((SECONDS - start))s"
}

if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null || ! command -v runc >/dev/null; then
  log "installing podman, buildah, runc and debootstrap with apt-get"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman buildah runc debootstrap >/dev/null
fi
# shellcheck source=hack/podman.sh
. hack/podman.sh
podman_conf

glibc=localhost/gpuhealth-base-glibc:bookworm
builder=localhost/gpuhealth-base-builder:bookworm
static=localhost/gpuhealth-base-static:nonroot
build_args=()
volumes=()
if [ "$bases" = local ]; then
  mkdir -p "$cache"
  if ! podman image exists "$glibc"; then
    log "making $glibc with debootstrap --variant=minbase bookworm (once; cached by podman)"
    t0=$SECONDS
    root=$(mktemp -d "$cache/rootfs.XXXXXX")
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase bookworm "$root" >"$cache/debootstrap.log" 2>&1 ||
      { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/*
    tar -C "$root" -c . | podman import --change 'CMD ["/bin/sh"]' - "$glibc" >/dev/null
    rm -rf "$root"
    trap - EXIT
    log "made $glibc in $((SECONDS - t0))s"
  fi
  if ! podman image exists "$builder"; then
    log "making $builder (gcc, libc6-dev; Go comes from the host)"
    t0=$SECONDS
    printf 'FROM %s\nRUN apt-get update -q && apt-get install -y -q --no-install-recommends gcc libc6-dev ca-certificates >/dev/null && rm -rf /var/lib/apt/lists/*\nENV PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin GOPATH=/go GOTOOLCHAIN=local GOFLAGS=-buildvcs=false\n' "$glibc" |
      podman build -q -t "$builder" -f - "$cache" >/dev/null
    log "made $builder in $((SECONDS - t0))s"
  fi
  if ! podman image exists "$static"; then
    log "making $static"
    root=$(mktemp -d "$cache/static.XXXXXX")
    mkdir -p "$root/etc" "$root/tmp"
    chmod 1777 "$root/tmp"
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
    tar -C "$root" -c . | podman import - "$static" >/dev/null
    rm -rf "$root"
  fi
  build_args=(--build-arg "BUILDER_IMAGE=$builder" --build-arg "OPERATOR_BASE_IMAGE=$static" --build-arg "MONITOR_BASE_IMAGE=$glibc")
  # The host's Go toolchain, module cache and build cache, read by the build.
  volumes=(-v "$(go env GOROOT):/usr/local/go:ro" -v "$(go env GOMODCACHE):/go/pkg/mod" -v "$(go env GOCACHE):/root/.cache/go-build")
fi

for target in operator monitor; do
  log "building localhost/gpuhealth-$target:$tag (--target $target)"
  timed "built localhost/gpuhealth-$target:$tag" \
    podman build -q --target "$target" -t "localhost/gpuhealth-$target:$tag" "${build_args[@]}" "${volumes[@]}" . >/dev/null
done
podman images --format '{{.Repository}}:{{.Tag}} {{.ID}} {{.Size}}' --filter "reference=localhost/gpuhealth-operator:$tag" --filter "reference=localhost/gpuhealth-monitor:$tag"
