#!/usr/bin/env bash
# nvml535.sh fetches NVIDIA's own NVML library of driver branch 535, the
# oldest branch gpuhealth supports, for `make nvml-real` (e2e/nvmlreal):
# libnvidia-ml.so.1 and nvidia-smi of the same version, from the Debian 12
# (bookworm) packages libnvidia-ml1 and nvidia-smi in the non-free
# component. The packages are unpacked with dpkg-deb into a cache outside
# the repository, never installed: no process on this machine loads the
# library unless it is pointed at it (LD_LIBRARY_PATH).
#
#   ${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}/nvml-535/
#     libnvidia-ml.so.1 -> libnvidia-ml.so.<version>, nvidia-smi,
#     VERSION (the packages' Debian version)
#
# apt runs with a configuration of its own: the machine's own apt sources
# (same mirrors, same keys) with the non-free component instead of theirs,
# limited to the release's suites (bookworm, -updates, -security); private
# package lists and download directory; none of the host's update hooks. So
# the host's apt state is untouched, and apt checks the archive's signatures
# and the packages' hashes as it always does. No host name is written here.
#
# The oldest 535 version the suites offer is taken (NVML adds functions
# within a branch and never removes them, so the oldest is the strictest
# check); NVML535_VERSION=<Debian version> pins another. Idempotent: with
# the cache in place (and matching a pin) it contacts nothing and returns at
# once. Prints the version on stderr and the directory on the last line of
# stdout, so callers can do `dir=$(hack/nvml535.sh | tail -1)`.
set -euo pipefail

BRANCH=535
PACKAGES=(libnvidia-ml1 nvidia-smi)

cache_root=${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}
dir="$cache_root/nvml-${BRANCH}"

log() { printf '[nvml%s] %s\n' "$BRANCH" "$*" >&2; }
fail() { log "$*"; exit 1; }

# cached says whether dir holds a complete fetch (VERSION is written last)
# of the pinned version, if one is pinned.
cached() {
  [ -s "$dir/VERSION" ] && [ -f "$dir/libnvidia-ml.so.1" ] && [ -x "$dir/nvidia-smi" ] || return 1
  [ -z "${NVML535_VERSION:-}" ] || [ "$(cat "$dir/VERSION")" = "$NVML535_VERSION" ]
}

if cached; then
  log "libnvidia-ml1, nvidia-smi $(cat "$dir/VERSION"): cached"
  echo "$dir"
  exit 0
fi

start=$SECONDS
for cmd in apt-get apt-cache dpkg-deb; do
  command -v "$cmd" >/dev/null || fail "$cmd not found: this needs a Debian 12 (bookworm) machine's apt"
done
# shellcheck source=/dev/null
codename=$(. /etc/os-release && [ "${ID:-}" = debian ] && echo "${VERSION_CODENAME:-}") || true
[ -n "$codename" ] || fail "not a Debian machine (/etc/os-release): libnvidia-ml1 comes from Debian's non-free component"

work=$(mktemp -d)
stage=
trap 'rm -rf "$work" ${stage:+"$stage"}' EXIT
mkdir -p "$work/sources.list.d" "$work/lists/partial" "$work/cache" "$work/archives/partial" "$work/debs" "$work/root"

# The machine's sources, in either format, rewritten to the non-free
# component of this release's own suites; other suites (backports) and
# other repositories are left out. Options (signed-by, arch) are kept.
suites_re="^${codename}(-updates|-security)?\$"
shopt -s nullglob
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [ -f "$f" ] || continue
  awk -v re="$suites_re" '
    /^[ \t]*deb[ \t]/ {
      i = 2; opts = ""
      if ($2 ~ /^\[/) { opts = $2; while (opts !~ /\]$/ && i < NF) { i++; opts = opts " " $i }; i++; opts = opts " " }
      if ($(i + 1) ~ re) print "deb " opts $i " " $(i + 1) " non-free"
    }' "$f"
done >"$work/sources.list"
n=0
for f in /etc/apt/sources.list.d/*.sources; do
  n=$((n + 1))
  awk -v re="$suites_re" '
    function reset() { types = ""; uris = ""; suites = ""; enabled = ""; extra = ""; cont = 0 }
    function flush(   s, i, out) {
      if (types ~ /(^|[ \t])deb([ \t]|$)/ && uris != "" && tolower(enabled) != "no") {
        split(suites, s, /[ \t]+/)
        for (i = 1; i in s; i++) if (s[i] ~ re) out = out " " s[i]
        if (out != "") printf "Types: deb\nURIs: %s\nSuites:%s\nComponents: non-free\n%s\n", uris, out, extra
      }
      reset()
    }
    BEGIN { reset() }
    /^#/ { next }
    /^[ \t]*$/ { flush(); next }
    /^[ \t]/ { if (cont) extra = extra $0 "\n"; next }  # a continuation line (an inline key)
    {
      k = tolower(substr($0, 1, index($0, ":") - 1)); v = substr($0, index($0, ":") + 1)
      gsub(/^[ \t]+|[ \t]+$/, "", v); cont = 0
      if (k == "types") types = v
      else if (k == "uris") uris = v
      else if (k == "suites") suites = v
      else if (k == "enabled") enabled = v
      else if (k != "components") { extra = extra $0 "\n"; cont = 1 }
    }
    END { flush() }' "$f" >"$work/sources.list.d/derived-$n.sources"
done
if ! grep -qs . "$work/sources.list" "$work"/sources.list.d/*.sources; then
  fail "no apt source for Debian ${codename} in /etc/apt/sources.list{,.d}: cannot derive its non-free component"
fi

{
  echo "Dir::Etc::SourceList \"$work/sources.list\";"
  echo "Dir::Etc::SourceParts \"$work/sources.list.d\";"
  echo "Dir::State::Lists \"$work/lists\";"
  echo "Dir::Cache \"$work/cache\";"
  echo "Dir::Cache::Archives \"$work/archives\";"
  echo "Acquire::Languages \"none\";"
  # The host's hooks (image cleaners, PackageKit) are for its own apt runs.
  echo "#clear APT::Update::Pre-Invoke;"
  echo "#clear APT::Update::Post-Invoke;"
  echo "#clear APT::Update::Post-Invoke-Success;"
  # As root apt downloads as user _apt, who cannot write to a private
  # directory under root's home; root downloads itself instead.
  if [ "$(id -u)" = 0 ]; then echo "APT::Sandbox::User \"root\";"; fi
} >"$work/apt.conf"
apt=(-c "$work/apt.conf" -q)

log "reading the non-free indexes of Debian ${codename}"
apt-get "${apt[@]}" -qq update >&2
version=${NVML535_VERSION:-}
if [ -z "$version" ]; then
  # The oldest of the branch; sort -V orders Debian versions of one
  # upstream branch as dpkg does (535.261.03-1 < 535.309.01-0+deb12u1).
  version=$(apt-cache "${apt[@]}" madison libnvidia-ml1 | awk -F'|' '{ gsub(/[ \t]/, "", $2); print $2 }' |
    grep "^${BRANCH}\." | sort -uV | head -1) || true
  [ -n "$version" ] || fail "no libnvidia-ml1 of branch ${BRANCH} in Debian ${codename} non-free (apt-cache policy libnvidia-ml1 says what there is)"
fi
log "fetching ${PACKAGES[*]} ${version}"
(cd "$work/debs" && apt-get "${apt[@]}" -qq download "${PACKAGES[@]/%/=$version}" >&2)
for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$work/root"; done

link=$(find "$work/root" -name libnvidia-ml.so.1 | head -1)
smi=$(find "$work/root" -name nvidia-smi -type f -perm -u+x | head -1)
[ -n "$link" ] && [ -n "$smi" ] || fail "the packages hold no libnvidia-ml.so.1 or nvidia-smi"
lib=$(readlink -f "$link")

# Staged next to the cache and renamed into place, so a run that is
# stopped, or two at once, never leave a half-filled directory behind.
mkdir -p "$cache_root"
stage=$(mktemp -d "$cache_root/.nvml-${BRANCH}.XXXXXX")
chmod 0755 "$stage"
cp "$lib" "$stage/$(basename "$lib")"
ln -s "$(basename "$lib")" "$stage/libnvidia-ml.so.1"
cp "$smi" "$stage/nvidia-smi"
echo "$version" >"$stage/VERSION"
if cached; then
  log "another run has fetched it meanwhile"
else
  if [ -e "$dir" ]; then rm -rf "$dir.old" && mv -T "$dir" "$dir.old"; fi
  if mv -T "$stage" "$dir" 2>/dev/null; then stage=; else cached || fail "cannot move the library into $dir"; fi
  rm -rf "$dir.old"
fi
log "libnvidia-ml1, nvidia-smi ${version}: fetched into $dir in $((SECONDS - start))s"
echo "$dir"
