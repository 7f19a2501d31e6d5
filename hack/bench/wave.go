package main

import (
	"context"
	"fmt"
	"time"
)

// waveSet names the fault wave's node set, its Deployment and PDB, and the
// victimLabel value its policy selects.
const waveSet = "wave"

// waveResult is the fault wave: every node of a fresh set, full of one
// Deployment's pods under a PDB, reported Fatal at once and drained by a
// policy that allows it.
type waveResult struct {
	Nodes, Pods int
	// EvictionsPerSecond and MaxConcurrent are the wave policy's drain
	// limits.
	EvictionsPerSecond, MaxConcurrent int
	// PerNode are the nodes' times from their finding's create (when it
	// returned) to the node first seen without a workload pod, by node.
	PerNode []time.Duration
	// Whole is the first create to the last node seen empty.
	Whole time.Duration
	// Evictions is the workload pods that left the wave's nodes;
	// Replacement the median eviction to replacement Ready; Exhausted how
	// long of the wave the PDB allowed no disruption.
	Evictions              int
	Replacement, Exhausted time.Duration
}

// wavePolicy drains the wave's nodes and no others: the drain race's
// policy (maxUnavailable 100%, the breaker off, the given eviction
// limits) selecting victimLabel=wave. The wave's nodes carry no GPU label,
// so the bench policy (maxUnavailable 0) does not select them either.
func wavePolicy(perSecond, concurrent int) map[string]any {
	spec := drainPolicy(perSecond, concurrent)
	spec["nodeSelector"] = map[string]any{"matchLabels": map[string]any{victimLabel: waveSet}}
	return spec
}

// wave measures detection to drained in a fault wave, with the operator
// running at steady state: -wave fresh nodes, each full of -wave-pods pods
// of one Deployment under a PDB (the drain race's set, with as many spare
// nodes for the replacements), managed by a second policy that drains;
// one Fatal finding per node created at once, and each node timed from
// its own finding's create to the node first seen without a workload pod.
// The policy is created here rather than with the bench policy, so that
// the phases before run with one policy, as they always have.
func (h *harness) wave(ctx context.Context) (*waveResult, error) {
	o := h.o
	res := &waveResult{Nodes: o.wave, Pods: o.wavePods, EvictionsPerSecond: o.waveEvictionsPerSecond, MaxConcurrent: o.waveMaxConcurrentEvictions}
	if err := h.createPolicy(ctx, wavePolicyName, wavePolicy(res.EvictionsPerSecond, res.MaxConcurrent)); err != nil {
		return nil, err
	}
	pods := h.podWatch()
	victims, err := h.drainSet(ctx, waveSet, false, o.wave, o.wavePods)
	if err != nil {
		return nil, err
	}
	if err := h.waitPhase(ctx, victims, phaseHealthy); err != nil {
		return nil, err
	}
	logf("wave: %d Fatal findings at once on nodes of %d pods each (%d evictions/s, %d at a time)", len(victims), o.wavePods, res.EvictionsPerSecond, res.MaxConcurrent)
	pods.arm(victims, waveSet)
	start := time.Now()
	_, created, err := h.createEvents(ctx, victims)
	if err != nil {
		return nil, fmt.Errorf("wave: %w", err)
	}
	if err := h.waitEmptied(ctx, "wave", len(victims)); err != nil {
		return nil, err
	}
	res.PerNode = elapsed(created, pods.emptiedAt(victims))
	fromStart, evictions, replacement := pods.result(start)
	res.Whole, res.Evictions, res.Replacement = fromStart[len(fromStart)-1], evictions, replacement
	res.Exhausted = pods.exhausted(start, start.Add(res.Whole))
	return res, nil
}

// rateFloor is the least time the wave's evictions take at the policy's
// rate: the first goes at once, each further one a 1/rate later.
func (w *waveResult) rateFloor() time.Duration {
	return time.Duration(float64(max(w.Evictions-1, 0)) / float64(w.EvictionsPerSecond) * float64(time.Second))
}

// markdown prints the wave's table.
func (w *waveResult) markdown(p func(string, ...any)) {
	s := spreadOf(w.PerNode)
	p("| Fault wave: %d fresh nodes × %d pods of one Deployment (PDB maxUnavailable 10%%), a second policy draining them (maxUnavailable 100%%, %d evictions/s, %d at a time), one Fatal finding per node at once | p50 | p90 | p99 | max |", w.Nodes, w.Pods, w.EvictionsPerSecond, w.MaxConcurrent)
	p("|---|---:|---:|---:|---:|")
	p("| Finding created (its create returned) → its node seen without a workload pod | %s | %s | %s | %s |", dur(s.P50), dur(s.P90), dur(s.P99), dur(s.Max))
	p("")
	p("| The wave as a whole | |")
	p("|---|---:|")
	p("| first finding created → last node seen without a workload pod | **%s** |", dur(w.Whole))
	p("| pods evicted · eviction → replacement Ready (median) | %d · %s |", w.Evictions, dur(w.Replacement))
	p("| rate floor: (evictions − 1) ÷ %d/s | %s |", w.EvictionsPerSecond, dur(w.rateFloor()))
	p("| PDB allowing no disruption (a watch on its status) | %s (%.0f%%) |", dur(w.Exhausted), 100*ratio(w.Exhausted, w.Whole))
	p("")
}
