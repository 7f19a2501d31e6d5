package fakenvml

/*
#cgo CFLAGS: -DFAKENVML_PARSER_ONLY
#include <stdlib.h>
#include "scenario.h"
*/
import "C"

import (
	"fmt"
	"time"
	"unsafe"
)

// ParseScenario parses a whole scenario with the library's own C parser and
// returns how many directive lines it accepted and how many it rejected.
// Blank and comment lines count as neither.
func ParseScenario(data []byte) (directives, errors int) {
	p := parse(data)
	return p.directives, p.errors
}

// parsed is what the C parser made of a scenario, rendered for tests.
type parsed struct {
	directives, errors int
	// firstError is "line N: reason" for the first rejected line, or "".
	firstError string
	// devices holds one "index uuid busId name links" line per device.
	devices []string
	// ops holds one canonical line per accepted non-device directive.
	ops []string
}

func parse(data []byte) parsed {
	s := (*C.struct_fake_scenario)(C.calloc(1, C.sizeof_struct_fake_scenario))
	if s == nil {
		panic("fakenvml: out of memory")
	}
	C.fake_scenario_init(s)
	defer C.free(unsafe.Pointer(s))
	defer C.fake_scenario_free(s)
	C.fake_parse(s, (*C.char)(unsafe.Pointer(unsafe.SliceData(data))), C.size_t(len(data)), 1)

	p := parsed{
		directives: int(s.directives),
		errors:     int(s.errors),
		firstError: C.GoString(&s.first_error[0]),
	}
	for i := range int(s.ndevices) {
		d := &s.devices[i]
		p.devices = append(p.devices, fmt.Sprintf("%d %s %08X:%02X:%02X.%d %q links=%d", i,
			C.GoString(&d.uuid[0]), uint32(d.domain), uint32(d.bus), uint32(d.dev), uint32(d.function),
			C.GoString(&d.name[0]), uint32(d.links)))
	}
	if s.nops > 0 {
		for _, op := range unsafe.Slice(s.ops, int(s.nops)) {
			p.ops = append(p.ops, formatOp(&op))
		}
	}
	return p
}

// parseInTwo parses data the way the library reads a growing file: first
// data[:split] as a live read (complete lines only), then the rest, from
// where that read stopped, as a final read. It returns the counts.
func parseInTwo(data []byte, split int) (directives, errors int) {
	s := (*C.struct_fake_scenario)(C.calloc(1, C.sizeof_struct_fake_scenario))
	if s == nil {
		panic("fakenvml: out of memory")
	}
	C.fake_scenario_init(s)
	defer C.free(unsafe.Pointer(s))
	defer C.fake_scenario_free(s)
	base := (*C.char)(unsafe.Pointer(unsafe.SliceData(data)))
	used := int(C.fake_parse(s, base, C.size_t(split), 0))
	C.fake_parse(s, (*C.char)(unsafe.Add(unsafe.Pointer(base), used)), C.size_t(len(data)-used), 1)
	return int(s.directives), int(s.errors)
}

func formatOp(op *C.struct_fake_op) string {
	at := time.Duration(op.at.ns).String()
	if op.at.absolute != 0 {
		at = fmt.Sprintf("@%d.%09d", int64(op.at.ns)/1e9, int64(op.at.ns)%1e9)
	}
	switch op.kind {
	case C.FAKE_OP_XID:
		return fmt.Sprintf("xid device=%d code=%d at=%s", op.device, uint64(op.value), at)
	case C.FAKE_OP_LOST:
		return fmt.Sprintf("lost device=%d at=%s", op.device, at)
	case C.FAKE_OP_COUNTER_SET:
		return fmt.Sprintf("%s device=%d%s counter=%d value=%d at=%s",
			counterWord(op), op.device, counterLink(op), op.counter, uint64(op.value), at)
	case C.FAKE_OP_COUNTER_RAMP:
		length := "forever"
		if op.for_ns >= 0 {
			length = time.Duration(op.for_ns).String()
		}
		return fmt.Sprintf("%s device=%d%s counter=%d rate=%g from=%s for=%s",
			counterWord(op), op.device, counterLink(op), op.counter, float64(op.rate), at, length)
	case C.FAKE_OP_CLOCKS:
		return fmt.Sprintf("clocks device=%d reasons=%#x sm=%d sm_max=%d at=%s", op.device, uint64(op.value), op.num[C.FAKE_SM], op.num[C.FAKE_SM_MAX], at)
	case C.FAKE_OP_PCIE:
		return fmt.Sprintf("pcie device=%d gen=%d width=%d max_gen=%d max_width=%d gpu_max_gen=%d at=%s", op.device,
			op.num[C.FAKE_GEN], op.num[C.FAKE_WIDTH], op.num[C.FAKE_MAX_GEN], op.num[C.FAKE_MAX_WIDTH], op.num[C.FAKE_GPU_MAX_GEN], at)
	case C.FAKE_OP_UTIL:
		return fmt.Sprintf("util device=%d gpu=%d memory=%d at=%s", op.device, op.num[C.FAKE_UTIL_GPU], op.num[C.FAKE_UTIL_MEMORY], at)
	case C.FAKE_OP_REMAP:
		return fmt.Sprintf("remap device=%d corr=%d uncorr=%d pending=%d failure=%d at=%s", op.device,
			op.num[C.FAKE_CORR], op.num[C.FAKE_UNCORR], op.num[C.FAKE_PENDING], op.num[C.FAKE_FAILURE], at)
	case C.FAKE_OP_RETIRED:
		return fmt.Sprintf("retired device=%d pending=%d at=%s", op.device, op.state, at)
	case C.FAKE_OP_TEMP:
		return fmt.Sprintf("temp device=%d gpu=%d slowdown=%d shutdown=%d at=%s", op.device,
			op.num[C.FAKE_TEMP_GPU], op.num[C.FAKE_SLOWDOWN], op.num[C.FAKE_SHUTDOWN], at)
	case C.FAKE_OP_NVLINK_SPEED:
		return fmt.Sprintf("nvlinkspeed device=%d link=%d mbps=%d at=%s", op.device, op.link, op.num[C.FAKE_MBPS], at)
	case C.FAKE_OP_LINKSTATE:
		return fmt.Sprintf("linkstate device=%d link=%d state=%d at=%s", op.device, op.link, op.state, at)
	case C.FAKE_OP_FABRIC:
		return fmt.Sprintf("fabric device=%d state=%d health=%d status=%d clique=%d mask=%d cluster=%x at=%s",
			op.device, op.state, op.health, uint32(op.status), uint32(op.clique), uint32(op.mask),
			goBytes(op.cluster[:]), at)
	}
	return fmt.Sprintf("unknown op kind %d", op.kind)
}

// counterWord names the directive a counter op came from.
func counterWord(op *C.struct_fake_op) string {
	switch op.link {
	case C.FAKE_LINK_PCIE_REPLAY:
		return "pcireplay"
	case C.FAKE_LINK_ECC:
		return "ecc"
	}
	return "nvlink"
}

// counterLink is " link=L" for an NVLink counter, "" for the others.
func counterLink(op *C.struct_fake_op) string {
	if op.link >= C.FAKE_MAX_LINKS {
		return ""
	}
	return fmt.Sprintf(" link=%d", op.link)
}

// goBytes copies a C byte array into Go memory. It is plain Go rather than
// C.GoBytes: cgo's pointer check around a C call would add generated
// expressions to this file that linters report.
func goBytes(a []C.uchar) []byte {
	out := make([]byte, len(a))
	for i, b := range a {
		out[i] = byte(b)
	}
	return out
}
