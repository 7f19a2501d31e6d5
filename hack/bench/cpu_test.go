package main

import (
	"runtime"
	"testing"
	"time"
)

func TestCPUGroups(t *testing.T) {
	for comm, want := range map[string]string{
		"kube-apiserver":  "kube-apiserver",
		"kube-controller": "kube-controller-manager", // the kernel keeps 15 characters
		"gpuhealth-opera": "gpuhealth-operator",
		"etcd":            "etcd",
		"kwok":            "kwok",
		"bash":            "other",
		"kub":             "other",
	} {
		if got := cpuGroup(comm); got != want {
			t.Errorf("cpuGroup(%q) = %q, want %q", comm, got, want)
		}
	}
	// An operator binary under another name (-operator /tmp/op-before-the-change).
	defer setOperatorBinary("")
	setOperatorBinary("/tmp/op-before-the-change")
	if got := cpuGroup("op-before-the-c"); got != "gpuhealth-operator" {
		t.Errorf("the renamed operator binary is in group %q", got)
	}
}

func TestCPUSnapshots(t *testing.T) {
	before := cpuSnapshot{"etcd": 1, "kwok": 2}
	after := cpuSnapshot{"etcd": 1.5, "kwok": 2, "other": 3}
	d := after.minus(before)
	if len(d) != 2 || d["etcd"] != 0.5 || d["other"] != 3 || d.total() != 3.5 {
		t.Errorf("minus = %v", d)
	}
	if after.minus(nil) != nil {
		t.Error("a missing snapshot gives no difference")
	}
	if runtime.GOOS != "linux" {
		return
	}
	const self = "harness (this program)"
	s := takeCPU()
	if _, ok := s[self]; !ok {
		t.Fatalf("this process is not in the snapshot: %v", s)
	}
	// Burn CPU until the kernel's 10 ms ticks show it, for at most 5 s.
	deadline := time.Now().Add(5 * time.Second)
	x := 0
	for time.Now().Before(deadline) {
		for i := range 1_000_000 {
			x += i * i
		}
		if takeCPU().minus(s)[self] > 0 {
			return
		}
	}
	t.Errorf("5 s of busy work did not show in this process's CPU (%d)", x)
}
