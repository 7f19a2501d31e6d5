package main

import (
	"slices"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// callTimes are one NVML function's durations.
type callTimes struct {
	took   []time.Duration
	failed int
}

// timings are the durations of the NVML calls this command made itself, by
// function. Only the reading goroutine uses it.
type timings map[string]*callTimes

// call runs f, one NVML call of function name, and records how long it
// took and whether it failed.
func (t timings) call(name string, f func() gonvml.Return) gonvml.Return {
	start := time.Now()
	ret := f()
	took := time.Since(start)
	ct := t[name]
	if ct == nil {
		ct = &callTimes{}
		t[name] = ct
	}
	ct.took = append(ct.took, took)
	if ret != gonvml.SUCCESS {
		ct.failed++
	}
	return ret
}

// lines returns one timing line per function, by name, and the number of
// calls.
func (t timings) lines() ([]timingLine, int) {
	names := make([]string, 0, len(t))
	for n := range t {
		names = append(names, n)
	}
	slices.Sort(names)
	out := make([]timingLine, 0, len(names))
	total := 0
	for _, n := range names {
		ct := t[n]
		took := slices.Clone(ct.took)
		slices.Sort(took)
		out = append(out, timingLine{
			Kind: kindTiming, Call: n, Count: len(took), Failed: ct.failed,
			MinNs: int64(took[0]), MedianNs: int64(took[(len(took)-1)/2]), MaxNs: int64(took[len(took)-1]),
		})
		total += len(took)
	}
	return out, total
}
