package pipeline

import (
	"github.com/prometheus/client_golang/prometheus"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors/metrics"
)

// Label names.
const (
	labelSource   = "source"
	labelCheck    = "check"
	labelSeverity = "severity"
	labelReason   = "reason"

	// The reasons of gpuhealth_monitor_findings_dropped_total.
	dropInvalid   = "Invalid"
	dropRejected  = "Rejected"
	dropSpoolFull = "SpoolFull"
	labelVerb     = "verb"

	// reasonNameTaken is the reason of gpuhealth_monitor_publish_errors_total
	// for an object of another finding under the name a finding is written to.
	reasonNameTaken = "NameTaken"
)

var (
	// findingsTotal counts findings reported by the sources, after
	// classification, including repeats and resolutions.
	findingsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_monitor_findings_total",
		Help: "Findings reported by the monitor's sources, by source, check and severity.",
	}, []string{labelSource, labelCheck, labelSeverity})

	// droppedTotal counts findings the pipeline gave up on.
	droppedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_monitor_findings_dropped_total",
		Help: "Findings dropped by the monitor: invalid ones, ones the apiserver rejected as invalid, and Info or Degraded ones the full spool had no room for.",
	}, []string{labelSeverity, labelReason})

	// heldTotal counts findings held back by a debounce rule.
	heldTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_monitor_findings_debounced_total",
		Help: "Findings held back by a debounce rule until they repeat enough.",
	}, []string{labelSource, labelCheck})

	// publishLatency is the time from a finding's report to the write that
	// carried it to the apiserver.
	publishLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "gpuhealth_monitor_publish_latency_seconds",
		Help:    "Time from a source reporting a finding to the apiserver acknowledging the write that carries it.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
	})

	// publishErrors counts failed writes by a bounded reason.
	publishErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_monitor_publish_errors_total",
		Help: "Failed NodeHealthEvent reads and writes, by reason (Unavailable, Forbidden, Invalid, Conflict, NameTaken, Other).",
	}, []string{labelReason})

	// writesTotal counts successful writes by verb.
	writesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_monitor_writes_total",
		Help: "NodeHealthEvent writes the apiserver accepted, by verb (create, patch_status).",
	}, []string{labelVerb})

	// spoolRecords is the number of findings waiting in the spool.
	spoolRecords = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_spool_records",
		Help: "Findings in the on-disk spool that the apiserver has not acknowledged yet.",
	})
)

func init() {
	metrics.Registry.MustRegister(findingsTotal, droppedTotal, heldTotal, publishLatency, publishErrors, writesTotal, spoolRecords)
	// Every drop series from zero, so the first drop is an increase() an
	// alert sees, not a new series at 1.
	for _, sev := range []gpuhealthv1alpha1.Severity{gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.SeverityFatal} {
		for _, reason := range []string{dropInvalid, dropRejected, dropSpoolFull} {
			droppedTotal.WithLabelValues(string(sev), reason)
		}
	}
}
