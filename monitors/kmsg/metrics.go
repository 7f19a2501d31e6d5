package kmsg

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuhealth/gpuhealth/monitors/metrics"
)

const labelResult = "result"

// Values of the result label.
const (
	resultFinding   = "finding"
	resultIgnored   = "ignored"
	resultMalformed = "malformed"
	resultUserspace = "userspace"
	// resultManagement is an mlx5 line about a NIC NICResolver says is not
	// the compute fabric: read, understood and deliberately not reported.
	resultManagement = "management"
)

var (
	lines = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_monitor_kmsg_lines_total",
		Help: "Number of kernel log records read, by result: finding, ignored (not ours, or already processed before a restart), malformed, userspace (written by a process, never a finding) or management (an mlx5 line about a management NIC, not reported).",
	}, []string{labelResult})

	overruns = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpuhealth_monitor_kmsg_overruns_total",
		Help: "Number of times the kernel overwrote records in its ring buffer before the monitor read them.",
	})
)

func init() {
	metrics.Registry.MustRegister(lines, overruns)
}
