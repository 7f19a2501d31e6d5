package main

import (
	"fmt"
	"math"

	"k8s.io/apimachinery/pkg/api/resource"
)

// memoryLimitEnv carries the container's memory limit in bytes, as the
// chart passes it through the downward API (resourceFieldRef
// limits.memory; without a limit Kubernetes passes the node's allocatable
// memory).
const memoryLimitEnv = "GPUHEALTH_MEMORY_LIMIT"

// softMemoryLimit is the Go runtime's soft memory limit for a container
// limit: ratio of the bytes in memoryLimitEnv, so that the collector works
// harder as the heap nears the limit instead of letting garbage take the
// process to the kernel's OOM kill. It returns 0 (leave the runtime as it
// is) when GOMEMLIMIT is set, which the runtime has applied already and an
// operator's explicit setting wins, when no limit is passed, or when ratio
// is 0.
func softMemoryLimit(getenv func(string) string, ratio float64) (int64, error) {
	if ratio < 0 || ratio > 1 || math.IsNaN(ratio) {
		return 0, fmt.Errorf("--memory-limit-ratio must be between 0 and 1, got %g", ratio)
	}
	if ratio == 0 || getenv("GOMEMLIMIT") != "" {
		return 0, nil
	}
	v := getenv(memoryLimitEnv)
	if v == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not a memory size: %w", memoryLimitEnv, v, err)
	}
	limit, ok := q.AsInt64()
	if !ok || limit <= 0 {
		return 0, fmt.Errorf("%s=%q is not a positive number of bytes", memoryLimitEnv, v)
	}
	return int64(float64(limit) * ratio), nil
}
