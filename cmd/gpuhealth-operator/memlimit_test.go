package main

import (
	"strings"
	"testing"
)

func TestSoftMemoryLimit(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	for _, tc := range []struct {
		name  string
		env   func(string) string
		ratio float64
		want  int64
		err   string
	}{
		// The downward API writes limits.memory as whole bytes.
		{"chart's 512Mi", env(memoryLimitEnv, "536870912"), 0.9, 483183820, ""},
		{"a quantity", env(memoryLimitEnv, "200Mi"), 0.9, 188743680, ""},
		{"whole limit", env(memoryLimitEnv, "1Gi"), 1, 1 << 30, ""},
		{"no limit passed", env(), 0.9, 0, ""},
		{"ratio 0 turns it off", env(memoryLimitEnv, "1Gi"), 0, 0, ""},
		{"GOMEMLIMIT wins", env(memoryLimitEnv, "1Gi", "GOMEMLIMIT", "300MiB"), 0.9, 0, ""},
		{"not a size", env(memoryLimitEnv, "lots"), 0.9, 0, "is not a memory size"},
		{"zero", env(memoryLimitEnv, "0"), 0.9, 0, "not a positive number"},
		{"negative", env(memoryLimitEnv, "-5Mi"), 0.9, 0, "not a positive number"},
		{"ratio over 1", env(memoryLimitEnv, "1Gi"), 1.5, 0, "between 0 and 1"},
		{"negative ratio", env(memoryLimitEnv, "1Gi"), -0.1, 0, "between 0 and 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := softMemoryLimit(tc.env, tc.ratio)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("= %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}
