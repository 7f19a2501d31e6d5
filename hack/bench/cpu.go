package main

import (
	"path/filepath"
	"sort"
	"strings"
)

// cpuSnapshot is CPU seconds used so far, by process group.
type cpuSnapshot map[string]float64

// cpuGroups name the processes the benchmark runs, by the start of their
// command name (the kernel keeps 15 characters of it).
var cpuGroups = []string{"kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok", "gpuhealth-operator"}

// operatorComm is the command name the operator binary runs under (its
// file name, cut as the kernel cuts it), so that a binary passed with
// -operator under another name is still the operator's group.
var operatorComm string

// setOperatorBinary records the command name of the operator binary at path.
func setOperatorBinary(path string) {
	if path == "" {
		operatorComm = ""
		return
	}
	operatorComm = filepath.Base(path)
	if len(operatorComm) > 15 {
		operatorComm = operatorComm[:15]
	}
}

func cpuGroup(comm string) string {
	if comm == operatorComm {
		return "gpuhealth-operator"
	}
	for _, g := range cpuGroups {
		if strings.HasPrefix(comm, g) || (len(comm) >= 4 && strings.HasPrefix(g, comm)) {
			return g
		}
	}
	return "other"
}

// minus is the CPU used between before and s; nil when either is missing.
func (s cpuSnapshot) minus(before cpuSnapshot) cpuSnapshot {
	if s == nil || before == nil {
		return nil
	}
	out := cpuSnapshot{}
	for g, v := range s {
		if d := v - before[g]; d > 0 {
			out[g] = d
		}
	}
	return out
}

func (s cpuSnapshot) total() float64 {
	t := 0.0
	for _, v := range s {
		t += v
	}
	return t
}

// cpuRows returns the groups of every snapshot, the biggest user in the
// first one first.
func cpuRows(snaps ...cpuSnapshot) []string {
	out := keysOf(snaps...)
	first := snaps[0]
	sort.Slice(out, func(i, j int) bool {
		if first[out[i]] != first[out[j]] {
			return first[out[i]] > first[out[j]]
		}
		return out[i] < out[j]
	})
	return out
}
