# podman.sh is sourced by hack/image.sh and hack/realnode.sh: podman as root
# on these machines. It needs log() from the sourcing script.
#
# runc: crun refuses these machines' hybrid cgroup hierarchy.
podman() { command podman --runtime runc "$@"; }

# podman_conf sets `default_ulimits = []` in containers.conf: without it runc
# fails "error setting rlimit type 7" here.
podman_conf() {
  local conf=/etc/containers/containers.conf
  grep -qs '^[[:space:]]*default_ulimits' "$conf" && return 0
  log "setting default_ulimits = [] in $conf"
  mkdir -p "$(dirname "$conf")"
  if grep -qs '^\[containers\]' "$conf"; then
    sed -i 's/^\[containers\]/[containers]\ndefault_ulimits = []/' "$conf"
  else
    printf '\n[containers]\ndefault_ulimits = []\n' >>"$conf"
  fi
}
