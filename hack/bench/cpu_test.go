package main

import (
	"runtime"
	"testing"
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
	s := takeCPU()
	for i := 0; i < 1e7; i++ { // burn a little CPU in this process
		_ = i * i
	}
	if _, ok := takeCPU().minus(s)["harness (this program)"]; !ok && s["harness (this program)"] == 0 {
		t.Errorf("this process is not in the snapshot: %v", s)
	}
}
