#!/usr/bin/env bash
# device-check.sh runs the node agent's NVML checks once against this
# machine's real NVIDIA GPUs (hack/devicecheck) and keeps what they saw:
# every reading of every check, the findings the agent would make (a dry
# run: nothing is written to any apiserver) and how long each NVML call
# took. A healthy idle node makes no finding, so it is a pass/fail check.
#
#   hack/device-check.sh [devicecheck flags…]
#       e.g. --dcgm=off, --dcgm=on, --config monitor.yaml, --poll 5s, --nvml-library PATH
#
# It builds the check with cgo (go-nvml loads libnvidia-ml.so.1 through
# it) into _output/bin/devicecheck; on a machine without a Go toolchain it
# runs the binary already there, built elsewhere and copied along. It runs
# it for ${DURATION:-60s} and writes
#
#   ${OUT:-_output/device-check}/device-check.jsonl  the JSON lines (reading,
#                                                    finding, timing, summary)
#   ${OUT:-_output/device-check}/device-check.log    the human account, also
#                                                    shown on stderr
#
# The exit status is the check's: 0 pass (no finding); 1 a finding was
# made, or a source failed; 2 NVML could not be initialised (no NVIDIA
# driver loaded, or libnvidia-ml.so.1 not in the loader's path), so nothing
# was checked; 3 a bad flag or configuration file.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-_output/device-check}
DURATION=${DURATION:-60s}
BIN=_output/bin/devicecheck

log() { printf '[device-check] %s\n' "$*" >&2; }

mkdir -p "$OUT" "$(dirname "$BIN")"
if command -v go >/dev/null 2>&1; then
	log "building ./hack/devicecheck into $BIN"
	CGO_ENABLED=1 go build -o "$BIN" ./hack/devicecheck
elif [ -x "$BIN" ]; then
	log "no Go toolchain here: running the $BIN already built"
else
	log "no Go toolchain and no $BIN: build it elsewhere (CGO_ENABLED=1 go build -o $BIN ./hack/devicecheck) and copy it here"
	exit 1
fi

jsonl=$OUT/device-check.jsonl
human=$OUT/device-check.log
log "running the checks for $DURATION; JSON lines to $jsonl"
set +e
# stderr goes through tee to the log and the terminal; stdout to the file.
"$BIN" --duration "$DURATION" "$@" 2>&1 >"$jsonl" | tee "$human" >&2
rc=${PIPESTATUS[0]}
set -e

case $rc in
0) log "PASS: no finding; the readings are in $jsonl" ;;
1) log "FAIL: see the finding lines and the summary in $jsonl" ;;
2)
	log "NVML could not be initialised, so nothing was checked: this machine has no usable NVIDIA driver"
	log "(is the nvidia kernel module loaded, do /dev/nvidia* exist, and does 'ldconfig -p | grep libnvidia-ml.so.1' find the library?)"
	;;
*) log "devicecheck exited with status $rc" ;;
esac
if [ -s "$jsonl" ]; then
	log "summary: $(tail -n 1 "$jsonl")"
fi
exit "$rc"
