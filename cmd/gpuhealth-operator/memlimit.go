package main

import (
	"errors"
	"fmt"
	"math"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"k8s.io/apimachinery/pkg/api/resource"
)

// memoryLimitEnv carries the container's memory limit in bytes, as the
// chart passes it through the downward API (resourceFieldRef
// limits.memory; without a limit Kubernetes passes the node's allocatable
// memory).
const memoryLimitEnv = "GPUHEALTH_MEMORY_LIMIT"

// memoryLimit is the Go runtime's soft memory limit and where it came from.
type memoryLimit struct {
	// bytes is 0 when there is none to set.
	bytes int64
	// from is memoryLimitEnv, "cgroup", or why there is none.
	from string
}

// softMemoryLimit is the Go runtime's soft memory limit: ratio of the
// container's limit, so that the collector works harder as the heap nears
// it instead of letting garbage take the process to the kernel's OOM kill.
// The limit is the bytes in memoryLimitEnv, or, when none is passed, the
// memory limit of the process's own cgroup (v1 or v2, read by automemlimit;
// a container run outside the chart). None (bytes 0) when GOMEMLIMIT is set,
// which the runtime has applied already and an operator's explicit setting
// wins, when ratio is 0, or when neither says of a limit. A limit passed
// that does not parse is an error; a cgroup that cannot be read is no limit.
func softMemoryLimit(getenv func(string) string, ratio float64, fromCgroup func() (uint64, error)) (memoryLimit, error) {
	if ratio < 0 || ratio > 1 || math.IsNaN(ratio) {
		return memoryLimit{}, fmt.Errorf("--memory-limit-ratio must be between 0 and 1, got %g", ratio)
	}
	switch {
	case ratio == 0:
		return memoryLimit{from: "--memory-limit-ratio=0"}, nil
	case getenv("GOMEMLIMIT") != "":
		return memoryLimit{from: "GOMEMLIMIT"}, nil
	}
	if v := getenv(memoryLimitEnv); v != "" {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return memoryLimit{}, fmt.Errorf("%s=%q is not a memory size: %w", memoryLimitEnv, v, err)
		}
		limit, ok := q.AsInt64()
		if !ok || limit <= 0 {
			return memoryLimit{}, fmt.Errorf("%s=%q is not a positive number of bytes", memoryLimitEnv, v)
		}
		return memoryLimit{bytes: int64(float64(limit) * ratio), from: memoryLimitEnv}, nil
	}
	limit, err := fromCgroup()
	switch {
	case errors.Is(err, memlimit.ErrNoLimit):
		return memoryLimit{from: "no container limit"}, nil
	case err != nil:
		return memoryLimit{from: "no container limit read: " + err.Error()}, nil //nolint:nilerr // a cgroup that cannot be read is no limit, by design
	case limit == 0 || limit > math.MaxInt64:
		return memoryLimit{from: "no container limit"}, nil
	}
	return memoryLimit{bytes: int64(float64(limit) * ratio), from: "cgroup"}, nil
}

// gcPercent is the collector's GOGC for a process with memory limit lim:
// without a soft limit and without GOGC in the environment, percent, so
// that the heap's goal stays nearer what is live (GOGC 100 lets it grow to
// twice that, and the runtime keeps freed heap mapped for a while); -1
// (leave the runtime's) otherwise: under a soft limit the collector already
// works harder only as the heap nears it.
func gcPercent(getenv func(string) string, lim memoryLimit, percent int) int {
	if lim.bytes > 0 || getenv("GOGC") != "" || percent <= 0 {
		return -1
	}
	return percent
}
