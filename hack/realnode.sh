#!/usr/bin/env bash
# realnode.sh runs one real Kubernetes node on this machine — containerd,
# kubelet and kube-proxy — joined to a local kwokctl control plane that also
# serves kwok's fake nodes, so that gpuhealth's chart can be installed and
# its pods really run (the real-node end-to-end tier, docs/e2e.md).
#
#   hack/realnode.sh up                  start it (a second up says it is running)
#   hack/realnode.sh down                stop it and undo every change to the host
#   hack/realnode.sh status              exit 0 when it is up; print where
#   hack/realnode.sh env                 print KUBECONFIG=… and the other paths
#   hack/realnode.sh load IMAGE…         copy podman images into the node's containerd
#   hack/realnode.sh static-image PKG REF
#                                        build Go package PKG static and import it as image REF
#
# Everything it starts and writes lives in the run folder
# GPUHEALTH_REALNODE_DIR (default ${TMPDIR:-/tmp}/gpuhealth-realnode):
# containerd's config, root, state and socket, the kubelet's root, the CNI
# configuration and IP allocations, the cluster, the pod logs, and every
# component's log under logs/. The binaries (kubelet, kube-proxy, kubectl,
# crictl, helm and the control plane) are built once by
# `hack/controlplane.sh node` into its versioned cache.
#
# What a node changes on the host, and `down` undoes in this order: the
# kubelet's pods (stopped through the CRI, which runs CNI DEL for each), the
# kube-proxy's iptables chains (kube-proxy --cleanup), containerd, the
# cluster, the kubelet's mounts below the run folder, the kubepods cgroups
# in every hierarchy, the CNI bridge, the pod log links in
# /var/log/containers, and the sysctls the kubelet (vm.overcommit_memory,
# kernel.panic, kernel.panic_on_oops, kernel.keys.*) and the bridge plugin
# (net.ipv4.ip_forward) set, restored to the values `up` found. Only one
# real node runs per machine: its ports (10250, 10248, 10249, 10256), the
# bridge, its subnet and /kubepods are host-wide.
#
# Needs root. Installs containerd, runc, containernetworking-plugins and
# podman with apt-get when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

RUN=${GPUHEALTH_REALNODE_DIR:-${TMPDIR:-/tmp}/gpuhealth-realnode}
NODE=${GPUHEALTH_REALNODE_NAME:-gpu-real-0}
CLUSTER_NAME=gpuhealth-realnode
BRIDGE=gh-cni0
POD_SUBNET=10.244.0.0/24
FAKE_POD_CIDR=10.245.0.0/16
SOCK=$RUN/containerd/containerd.sock
CLUSTER=$RUN/kwok/clusters/$CLUSTER_NAME
SANDBOX_IMAGE=localhost/gpuhealth-pause:realnode
SYSCTLS="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward"
export KWOK_WORKDIR=$RUN/kwok

log() { printf '[realnode %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "$*"; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (containerd, the kubelet, iptables, sysctls)"

bins() { B=$(hack/controlplane.sh node 2>>"$RUN/logs/build.log" | tail -1) || { tail -20 "$RUN/logs/build.log" >&2; die "hack/controlplane.sh node failed"; }; }
# cached sets B to the cached binaries' directory without building any.
cached() { B=$(hack/controlplane.sh 2>/dev/null | tail -1); }
crictl() { "$B/crictl" --runtime-endpoint "unix://$SOCK" --image-endpoint "unix://$SOCK" "$@"; }
ctr() { command ctr --address "$SOCK" --namespace k8s.io "$@"; }
# shellcheck source=hack/podman.sh
. hack/podman.sh

# alive NAME: the process of $RUN/NAME.pid runs (a zombie does not: PID 1
# of this machine may not reap).
alive() {
  local f=$RUN/$1.pid p
  [ -f "$f" ] || return 1
  p=$(cat "$f")
  kill -0 "$p" 2>/dev/null && [ "$(ps -o stat= -p "$p" 2>/dev/null | cut -c1)" != Z ]
}

# start NAME CMD…: run CMD in its own session, logging to logs/NAME.log.
start() {
  local name=$1; shift
  setsid "$@" >>"$RUN/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
}

# stop NAME: SIGTERM, up to 15 s, then SIGKILL.
stop() {
  local f=$RUN/$1.pid p
  [ -f "$f" ] || return 0
  p=$(cat "$f")
  if alive "$1"; then
    kill "$p" 2>/dev/null || true
    for _ in $(seq 75); do alive "$1" || break; sleep 0.2; done
    if alive "$1"; then log "$1 ($p) ignored SIGTERM; killing it"; kill -9 "$p" 2>/dev/null || true; fi
  fi
  rm -f "$f"
  log "stopped $1 ($p)"
}

# wait_for WHAT SECONDS CMD…: retry CMD every 0.2 s.
wait_for() {
  local what=$1 secs=$2; shift 2
  local until=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $until ] || die "$what: not after ${secs}s (logs in $RUN/logs)"
    sleep 0.2
  done
}

install_packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/portmap ] && [ -x /usr/lib/cni/host-local ] || missing+=(containernetworking-plugins)
  command -v podman >/dev/null || missing+=(podman)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]} with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$RUN/logs/apt.log" 2>&1 ||
      { tail -20 "$RUN/logs/apt.log" >&2; die "apt-get install ${missing[*]} failed"; }
  fi
  podman_conf
}

# static_image PKG REF: build Go package PKG (a path in this repository)
# with CGO_ENABLED=0 and import the binary alone as image REF, entrypoint
# /<basename of PKG>, into the node's containerd.
static_image() {
  local pkg=$1 ref=$2 name work
  name=$(basename "$pkg")
  work=$(mktemp -d "$RUN/images.XXXXXX")
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/rootfs/$name" "./$pkg"
  tar -C "$work/rootfs" -cf "$work/rootfs.tar" "$name"
  podman import -q --change "ENTRYPOINT [\"/$name\"]" "$work/rootfs.tar" "$ref" >/dev/null
  load "$ref"
  podman rmi -f "$ref" >/dev/null 2>&1 || true
  rm -rf "$work"
}

# load REF…: copy podman images into containerd's k8s.io namespace, all at
# once (each is mostly waiting on its archive's compression and writes).
load() {
  local ref pids=() failed=0 pid
  for ref in "$@"; do
    load_one "$ref" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  [ "$failed" = 0 ] || die "loading images into containerd failed"
}

load_one() {
  local ref=$1 archive
  archive=$(mktemp "$RUN/image.XXXXXX.tar")
  podman save -q --format oci-archive -o "$archive" "$ref" || { rm -f "$archive"; return 1; }
  ctr images import "$archive" >/dev/null || { rm -f "$archive"; return 1; }
  rm -f "$archive"
  # An oci-archive names the image by its reference only as an annotation;
  # ctr keeps that name. Check that the kubelet will find it.
  crictl inspecti "$ref" >/dev/null 2>&1 || { log "image $ref is not in containerd after the import"; return 1; }
  log "loaded $ref"
}

node_ip() {
  ip -4 -o route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | grep . || hostname -I | awk '{print $1}'
}

write_configs() {
  mkdir -p "$RUN"/{containerd,cni/net.d,cni/ipam,kubelet,pod-logs}
  cat >"$RUN/containerd/config.toml" <<TOML
version = 2
root = "$RUN/containerd/root"
state = "$RUN/containerd/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  address = "$RUN/containerd/debug.sock"
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$RUN/containerd/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "$SANDBOX_IMAGE"
    stream_server_address = "127.0.0.1"
    # This machine lacks CAP_SYS_RESOURCE: runc cannot lower a sandbox's
    # oom_score_adj ("failed to update /proc/self/oom_score_adj").
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "$RUN/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = "$RUN/containerd/runc"
TOML
  cat >"$RUN/cni/net.d/10-gpuhealth-realnode.conflist" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "gpuhealth-realnode",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$RUN/cni/ipam", "ranges": [[{"subnet": "$POD_SUBNET"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
  cat >"$RUN/kwokctl.yaml" <<YAML
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  # The ClusterIP of default/kubernetes (service range 10.0.0.0/24): pods
  # reach the apiserver through it and verify its certificate.
  kubeApiserverCertSANs: ["10.0.0.1"]
componentsPatches:
- name: kwok-controller
  extraArgs:
  # kwok manages only the fake nodes, never $NODE.
  - {key: manage-all-nodes, value: "false", override: true}
  - {key: manage-nodes-with-annotation-selector, value: "kwok.x-k8s.io/node=fake"}
  # Fake pods' IPs; kwok's default overlaps the service range.
  - {key: cidr, value: "$FAKE_POD_CIDR"}
# One of each and nobody restarts them: with leader election, an apiserver
# outage longer than the renew deadline makes them exit for good.
- name: kube-controller-manager
  extraArgs:
  - {key: leader-elect, value: "false"}
- name: kube-scheduler
  extraArgs:
  - {key: leader-elect, value: "false"}
- name: kube-apiserver
  extraArgs:
  # kubectl logs, exec and port-forward reach the kubelet.
  - {key: kubelet-client-certificate, value: $CLUSTER/pki/admin.crt}
  - {key: kubelet-client-key, value: $CLUSTER/pki/admin.key}
  - {key: kubelet-preferred-address-types, value: "InternalIP,Hostname"}
YAML
  cat >"$RUN/kubelet-config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$SOCK
# containerd 1.6 has no RuntimeConfig call; this machine's cgroups are v1 (hybrid).
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
# -999 needs CAP_SYS_RESOURCE, which this machine lacks.
oomScoreAdj: 0
# Else the kubelet adds KUBE-FIREWALL to the host's INPUT and OUTPUT chains.
makeIPTablesUtilChains: false
address: 0.0.0.0
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
podLogsDir: $RUN/pod-logs
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $CLUSTER/pki/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
serializeImagePulls: false
# Quick restarts of a container the tests stop.
syncFrequency: 10s
# The node shares the host's disk, whose free space is the host's
# business (a developer's build cache): the defaults (imagefs under 15%
# free, nodefs under 10%) taint it DiskPressure on a big, busy disk and
# the chart's pods never schedule. Only a nearly full disk counts here.
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
YAML
  cat >"$RUN/kube-proxy-config.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $CLUSTER/kubeconfig.yaml}
hostnameOverride: $NODE
clusterCIDR: $POD_SUBNET
nodePortAddresses: ["primary"]
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Else kube-proxy sets net.ipv4.conf.all.route_localnet=1 and adds KUBE-FIREWALL.
iptables: {localhostNodePorts: false}
# Leave the host's conntrack sysctls alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
YAML
}

# kube_chains lists "TABLE CHAIN" for every KUBE-* chain, both families.
kube_chains() {
  local ipt t
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for t in filter nat mangle; do
      "$ipt" -t "$t" -S 2>/dev/null | sed -n "s/^-N \(KUBE-[^ ]*\)$/$ipt $t \1/p"
    done
  done
}

# remove_new_kube_chains deletes the KUBE-* chains that were not there
# before up (kube-proxy --cleanup removes its own; the kubelet leaves
# KUBE-FIREWALL, jumped to from INPUT and OUTPUT), with the rules that jump
# to them.
remove_new_kube_chains() {
  [ -f "$RUN/iptables.orig" ] || return 0
  local ipt t chain rule
  while read -r ipt t chain; do
    grep -qx "$ipt $t $chain" "$RUN/iptables.orig" && continue
    "$ipt" -t "$t" -S 2>/dev/null | grep -E -- "-j $chain( |$)" | sed 's/^-A /-D /' | while read -r rule; do
      # shellcheck disable=SC2086 # a rule is a list of arguments
      "$ipt" -t "$t" $rule 2>/dev/null
    done
    "$ipt" -t "$t" -F "$chain" 2>/dev/null
    "$ipt" -t "$t" -X "$chain" 2>/dev/null && log "removed $ipt -t $t chain $chain"
  done < <(kube_chains)
}

node_ready() {
  [ "$("$B/kubectl" --kubeconfig "$CLUSTER/kubeconfig.yaml" get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

proxy_ready() { iptables -t nat -S KUBE-SERVICES | grep -q 'default/kubernetes:https'; }

print_env() {
  cat <<EOF
GPUHEALTH_REALNODE_DIR=$RUN
KUBECONFIG=$CLUSTER/kubeconfig.yaml
KWOK_WORKDIR=$RUN/kwok
REALNODE_CLUSTER=$CLUSTER_NAME
REALNODE_NODE=$NODE
REALNODE_BIN=$B
REALNODE_CRI=unix://$SOCK
EOF
}

up() {
  mkdir -p "$RUN/logs"
  if alive kubelet; then
    bins
    log "a real node ($NODE) is already up in $RUN; 'hack/realnode.sh down' stops it"
    print_env
    return 0
  fi
  if [ -e "$RUN/sysctl.orig" ] || [ -e "$RUN/iptables.orig" ] || [ -d "$RUN/kwok" ]; then
    log "a previous node in $RUN did not stop cleanly; tearing it down first"
    down
    mkdir -p "$RUN/logs"
  fi
  # A new node, new logs.
  rm -rf "$RUN/logs"
  mkdir -p "$RUN/logs"
  local t0=$SECONDS
  # Whatever fails from here on, nothing stays behind.
  trap 'log "up failed; tearing down (logs: $RUN/logs)"; down || true' EXIT
  install_packages
  bins
  # The values down restores, and the kube chains that were there before.
  for k in $SYSCTLS; do echo "$k=$(sysctl -n "$k")"; done >"$RUN/sysctl.orig"
  kube_chains >"$RUN/iptables.orig"
  write_configs

  start containerd containerd --config "$RUN/containerd/config.toml"
  wait_for "containerd" 30 command ctr --address "$SOCK" version
  static_image hack/realnode/pause "$SANDBOX_IMAGE"
  log "containerd up with sandbox image $SANDBOX_IMAGE ($((SECONDS - t0))s)"

  # kwokctl picks ports by listening and closing, from 32766 down in every
  # run: clusters on this machine are created one at a time, under the lock
  # the e2e harnesses take too (e2e/framework's lockPorts). -o: flock
  # holds it, not the components kwokctl leaves running.
  flock -o -w 300 -E 75 "$B/.ports.lock" \
    "$B/kwokctl" --config "$RUN/kwokctl.yaml" create cluster --name "$CLUSTER_NAME" --runtime binary \
    --etcd-binary "$B/etcd" --kube-apiserver-binary "$B/kube-apiserver" \
    --kube-controller-manager-binary "$B/kube-controller-manager" \
    --kube-scheduler-binary "$B/kube-scheduler" --kwok-controller-binary "$B/kwok" \
    --kubeconfig "$RUN/kubeconfig-unused.yaml" --wait 2m --timeout 3m >>"$RUN/logs/kwokctl.log" 2>&1 || {
    rc=$?
    [ "$rc" = 75 ] && die "another cluster on this machine held $B/.ports.lock for 5 minutes"
    tail -20 "$RUN/logs/kwokctl.log" >&2
    false
  }
  log "control plane $CLUSTER_NAME up ($((SECONDS - t0))s)"

  start kubelet "$B/kubelet" --config="$RUN/kubelet-config.yaml" --kubeconfig="$CLUSTER/kubeconfig.yaml" \
    --root-dir="$RUN/kubelet" --hostname-override="$NODE" --node-ip="$(node_ip)" \
    --node-labels="nvidia.com/gpu.present=true,gpuhealth.dev/real-node=true" --v=2
  wait_for "node $NODE Ready" 120 node_ready
  log "node $NODE Ready ($((SECONDS - t0))s)"

  start kube-proxy "$B/kube-proxy" --config="$RUN/kube-proxy-config.yaml" --v=2
  wait_for "kube-proxy's rules for default/kubernetes" 60 proxy_ready
  trap - EXIT
  log "kube-proxy programmed the kubernetes Service; the node is up in $((SECONDS - t0))s (logs: $RUN/logs)"
  print_env
}

down() {
  # Every step runs, whatever the one before it did.
  set +e
  local left=0
  [ -n "${B:-}" ] || cached
  # First the kubelet, so it starts nothing again.
  stop kubelet
  if [ -S "$SOCK" ]; then
    # Stopping and removing every sandbox kills its containers and runs CNI DEL.
    crictl rmp -fa >/dev/null 2>&1 || true
    log "pods removed; $(crictl pods -q 2>/dev/null | wc -l) left"
  fi
  stop kube-proxy
  [ -f "$RUN/kube-proxy-config.yaml" ] && [ -x "$B/kube-proxy" ] && "$B/kube-proxy" --cleanup --config="$RUN/kube-proxy-config.yaml" >>"$RUN/logs/kube-proxy.log" 2>&1 || true
  stop containerd
  # Shims of our containerd outlive it; they are ours by their address.
  pkill -f "containerd-shim-runc-v2 .*-address $SOCK" 2>/dev/null || true
  if [ -d "$RUN/kwok/clusters/$CLUSTER_NAME" ]; then
    "$B/kwokctl" delete cluster --name "$CLUSTER_NAME" >>"$RUN/logs/kwokctl.log" 2>&1 && log "control plane deleted" || { log "kwokctl delete cluster failed"; left=1; }
  fi
  # The kubelet bind-mounts its root onto itself and mounts volumes below
  # it; containerd mounts rootfs overlays and shm below its root and state.
  local m
  for m in "$RUN/kubelet" "$RUN/containerd/state" "$RUN/containerd/root"; do mountpoint -q "$m" && umount -R "$m" 2>/dev/null; done
  grep -o " $RUN/[^ ]*" /proc/self/mounts | sort -r | while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  # The kubelet's QoS cgroups, left in every hierarchy.
  local d
  for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  remove_new_kube_chains
  ip link del "$BRIDGE" 2>/dev/null || true
  # The kubelet links each container's log into /var/log/containers.
  [ -d /var/log/containers ] && find /var/log/containers -maxdepth 1 -lname "$RUN/*" -delete 2>/dev/null
  if [ -f "$RUN/sysctl.orig" ]; then
    while IFS='=' read -r k v; do sysctl -qw "$k=$v" 2>/dev/null || log "could not restore $k=$v"; done <"$RUN/sysctl.orig"
    rm -f "$RUN/sysctl.orig"
    log "sysctls restored"
  fi
  rm -rf "$RUN/containerd" "$RUN/kubelet" "$RUN/cni" "$RUN/kwok" "$RUN/pod-logs" "$RUN"/images.* "$RUN"/image.*.tar 2>/dev/null || true
  # What would be left of us.
  local mounts cg chains shims
  mounts=$(grep -c " $RUN/" /proc/self/mounts || true)
  cg=$(find /sys/fs/cgroup -maxdepth 2 -name kubepods 2>/dev/null | wc -l)
  chains=0
  [ -f "$RUN/iptables.orig" ] && chains=$(kube_chains | { grep -vxF -f "$RUN/iptables.orig" || true; } | wc -l)
  shims=$(pgrep -c -f "containerd-shim.*$SOCK" || true)
  local link=0
  ip link show "$BRIDGE" >/dev/null 2>&1 && link=1
  log "left behind: mounts=$mounts kubepods-cgroups=$cg kube-chains=$chains shims=$shims bridge=$link"
  rm -f "$RUN/iptables.orig"
  if [ "$mounts$cg$chains$shims$link" != 00000 ] || [ $left != 0 ]; then
    log "down did not undo everything"
    return 1
  fi
}

status() {
  if alive kubelet && alive containerd; then
    cached
    log "up: node $NODE in $RUN"
    print_env
    return 0
  fi
  log "not up ($RUN)"
  return 1
}

case "${1:-}" in
  up) up ;;
  down) if [ -d "$RUN" ]; then mkdir -p "$RUN/logs"; down; else log "not up ($RUN); nothing to do"; fi ;;
  status) status ;;
  env) cached; print_env ;;
  load) shift; alive containerd || die "the node is not up"; cached; load "$@" ;;
  static-image) alive containerd || die "the node is not up"; cached; static_image "$2" "$3" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
