package computedomain

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	viewAvailable = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "gpuhealth_computedomain_view_available",
		Help: "1 when the ComputeDomain CRDs are served and watched, 0 when membership comes from node labels only.",
	})

	degradedCliques = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "gpuhealth_computedomain_degraded_cliques",
		Help: "Number of NVLink cliques whose nodes carry the fabric-degraded taint.",
	})

	fabricTaintChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_computedomain_fabric_taint_changes_total",
		Help: "Number of fabric-degraded taints added to or removed from nodes, by action.",
	}, []string{labelAction})

	cliqueCertifications = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_computedomain_clique_certifications_total",
		Help: "Number of multi-node clique certification attempts judged after a fabric fault resolved, by result (passed or failed).",
	}, []string{labelResult})
)

const (
	labelAction  = "action"
	labelResult  = "result"
	actionAdd    = "add"
	actionRemove = "remove"
)

func init() {
	metrics.Registry.MustRegister(viewAvailable, degradedCliques, fabricTaintChanges, cliqueCertifications)
}

// conflictRetry is the wait after an optimistic-lock conflict on a node.
const conflictRetry = time.Second
