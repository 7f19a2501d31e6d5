// Package grafana holds no code: its tests check the dashboard in this
// folder (structure, variables, layout) and run every query it makes
// against Prometheus's engine over series shaped like gpuhealth's.
package grafana
