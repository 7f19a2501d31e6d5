package dcgm

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuhealth/gpuhealth/monitors/metrics"
)

// labelKind is the policy violation kind label: xid, nvlink or other.
const labelKind = "kind"

var (
	// policyViolations counts policy violations received, by kind.
	policyViolations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_monitor_dcgm_policy_violations_total",
		Help: "DCGM policy violations the DCGM source received, by kind (xid, nvlink, other).",
	}, []string{labelKind})

	// droppedViolations counts violations go-dcgm dropped before the
	// source read them.
	droppedViolations = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpuhealth_monitor_dcgm_dropped_violations_total",
		Help: "DCGM policy violations dropped by go-dcgm because its listener channel was full.",
	})

	// pollErrors counts failed DCGM reads of the periodic poll.
	pollErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpuhealth_monitor_dcgm_poll_errors_total",
		Help: "Failed DCGM reads (NVLink counters of one GPU, IMEX fields, health check) of the DCGM source's polls.",
	})
)

func init() {
	metrics.Registry.MustRegister(policyViolations, droppedViolations, pollErrors)
}
