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
		return fmt.Sprintf("nvlink device=%d link=%d counter=%d value=%d at=%s",
			op.device, op.link, op.counter, uint64(op.value), at)
	case C.FAKE_OP_COUNTER_RAMP:
		length := "forever"
		if op.for_ns >= 0 {
			length = time.Duration(op.for_ns).String()
		}
		return fmt.Sprintf("nvlink device=%d link=%d counter=%d rate=%g from=%s for=%s",
			op.device, op.link, op.counter, float64(op.rate), at, length)
	case C.FAKE_OP_LINKSTATE:
		return fmt.Sprintf("linkstate device=%d link=%d state=%d at=%s", op.device, op.link, op.state, at)
	case C.FAKE_OP_FABRIC:
		return fmt.Sprintf("fabric device=%d state=%d health=%d status=%d clique=%d mask=%d cluster=%x at=%s",
			op.device, op.state, op.health, uint32(op.status), uint32(op.clique), uint32(op.mask),
			goBytes(op.cluster[:]), at)
	}
	return fmt.Sprintf("unknown op kind %d", op.kind)
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
