package eventgc

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var deleted = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "gpuhealth_nodehealthevents_deleted_total",
	Help: "Number of NodeHealthEvents garbage-collected, by why: retention (finished longer ago than the retention), cap (the oldest finished beyond the per-node cap) or cap-observed (the least recently seen active ones judged Observe, when a node's unfinished ones alone exceed the cap).",
}, []string{"reason"})

func init() {
	metrics.Registry.MustRegister(deleted)
	// From zero, so the dashboard shows the collector before its first delete.
	for _, r := range []string{ReasonRetention, ReasonCap, ReasonCapObserved} {
		deleted.WithLabelValues(r)
	}
}
