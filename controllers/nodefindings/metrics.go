package nodefindings

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

var (
	// stackInfo is one series per node and property of its stack, value 1:
	// join it on node to see which driver or VBIOS a node runs.
	stackInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_node_stack_info",
		Help: "A node's NVIDIA stack as its monitor reported it (NodeInventory): one series per node and property (driver, cudaDriver, vbios, inforom, fabricManager, imex, ecc, persistence, mig, product, powerLimit), value 1.",
	}, []string{"node", "pool", "property", "value"})
	// drift is one series per node property that differs from its pool's
	// majority, value 1; absent when none does.
	drift = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_node_drift",
		Help: "A node property that differs from its pool's majority (value 1), with the node's value and the majority's.",
	}, []string{"node", "pool", "property", "value", "majority"})
	written = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_derived_findings_total",
		Help: "Findings the operator derived from Node conditions, node stacks and GPU counts, by source and what was written: opened (created or opened again) or resolved.",
	}, []string{"source", "change"})
)

func init() {
	metrics.Registry.MustRegister(stackInfo, drift, written)
	for _, s := range []gpuhealthv1alpha1.Source{gpuhealthv1alpha1.SourceNodeCondition, gpuhealthv1alpha1.SourceOperator} {
		written.WithLabelValues(string(s), "opened")
		written.WithLabelValues(string(s), "resolved")
	}
}

// observe replaces the stack and drift series with a pass's.
func observe(w wanted) {
	stackInfo.Reset()
	for node, props := range w.stack {
		for p, v := range props {
			stackInfo.WithLabelValues(node, w.pools[node], string(p), v).Set(1)
		}
	}
	drift.Reset()
	for _, d := range w.drifts {
		drift.WithLabelValues(d.Node, d.Pool, string(d.Property), d.Value, d.Majority).Set(1)
	}
}

// count counts a write that succeeded.
func count(c change) {
	ev := c.patch
	if c.create != nil {
		ev = c.create
	}
	switch {
	case c.opened:
		written.WithLabelValues(string(ev.Spec.Source), "opened").Inc()
	case c.resolved:
		written.WithLabelValues(string(ev.Spec.Source), "resolved").Inc()
	}
}
