// Package metrics holds the node agent's Prometheus registry. The agent does
// not use controller-runtime's registry: importing it links client-go's
// typed clients and informers for every API group, which the agent never
// uses and which cost it memory on every node.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Registry is the registry the agent's /metrics endpoint serves.
var Registry = prometheus.NewRegistry()

func init() {
	Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}
