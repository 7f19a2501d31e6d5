package imex

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuhealth/gpuhealth/monitors/metrics"
)

const labelResult = "result"

// Values of the result label.
const (
	resultOK        = "ok"
	resultError     = "error"
	resultMalformed = "malformed"
)

var runs = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "gpuhealth_monitor_imex_runs_total",
	Help: "Number of nvidia-imex-ctl runs, by result: ok, error (did not start, failed or timed out) or malformed (output not understood).",
}, []string{labelResult})

func init() {
	metrics.Registry.MustRegister(runs)
}
