package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

func TestSoftMemoryLimit(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	cgroup := func(limit uint64, err error) func() (uint64, error) {
		return func() (uint64, error) { return limit, err }
	}
	noCgroupLimit := cgroup(0, memlimit.ErrNoLimit)
	for _, tc := range []struct {
		name   string
		env    func(string) string
		ratio  float64
		cgroup func() (uint64, error)
		want   int64
		from   string
		err    string
	}{
		// The downward API writes limits.memory as whole bytes.
		{"chart's 512Mi", env(memoryLimitEnv, "536870912"), 0.9, noCgroupLimit, 483183820, memoryLimitEnv, ""},
		{"a quantity", env(memoryLimitEnv, "200Mi"), 0.9, noCgroupLimit, 188743680, memoryLimitEnv, ""},
		{"whole limit", env(memoryLimitEnv, "1Gi"), 1, noCgroupLimit, 1 << 30, memoryLimitEnv, ""},
		{"the passed limit wins over the cgroup's", env(memoryLimitEnv, "200Mi"), 0.9, cgroup(1<<30, nil), 188743680, memoryLimitEnv, ""},
		{"none passed: the cgroup's", env(), 0.9, cgroup(200<<20, nil), 188743680, "cgroup", ""},
		{"none passed, none in the cgroup", env(), 0.9, noCgroupLimit, 0, "no container limit", ""},
		{"a cgroup that cannot be read is no limit", env(), 0.9, cgroup(0, errors.New("no mountinfo")), 0, "no container limit read: no mountinfo", ""},
		{"ratio 0 turns it off", env(memoryLimitEnv, "1Gi"), 0, cgroup(1<<30, nil), 0, "--memory-limit-ratio=0", ""},
		{"GOMEMLIMIT wins", env(memoryLimitEnv, "1Gi", "GOMEMLIMIT", "300MiB"), 0.9, cgroup(1<<30, nil), 0, "GOMEMLIMIT", ""},
		{"not a size", env(memoryLimitEnv, "lots"), 0.9, noCgroupLimit, 0, "", "is not a memory size"},
		{"zero", env(memoryLimitEnv, "0"), 0.9, noCgroupLimit, 0, "", "not a positive number"},
		{"negative", env(memoryLimitEnv, "-5Mi"), 0.9, noCgroupLimit, 0, "", "not a positive number"},
		{"ratio over 1", env(memoryLimitEnv, "1Gi"), 1.5, noCgroupLimit, 0, "", "between 0 and 1"},
		{"negative ratio", env(memoryLimitEnv, "1Gi"), -0.1, noCgroupLimit, 0, "", "between 0 and 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := softMemoryLimit(tc.env, tc.ratio, tc.cgroup)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil || got.bytes != tc.want || got.from != tc.from {
				t.Fatalf("= %+v, %v; want %d from %q", got, err, tc.want, tc.from)
			}
		})
	}
}

func TestGCPercent(t *testing.T) {
	env := func(gogc string) func(string) string {
		return func(k string) string {
			if k == "GOGC" {
				return gogc
			}
			return ""
		}
	}
	for _, tc := range []struct {
		name    string
		gogc    string
		limit   memoryLimit
		percent int
		want    int
	}{
		{"no limit: the flag's", "", memoryLimit{from: "no container limit"}, 50, 50},
		{"under a soft limit the runtime's", "", memoryLimit{bytes: 1 << 28, from: "cgroup"}, 50, -1},
		{"GOGC in the environment wins", "200", memoryLimit{}, 50, -1},
		{"0 leaves the runtime's", "", memoryLimit{}, 0, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := gcPercent(env(tc.gogc), tc.limit, tc.percent); got != tc.want {
				t.Fatalf("= %d, want %d", got, tc.want)
			}
		})
	}
}
