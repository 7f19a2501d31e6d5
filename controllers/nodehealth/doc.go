// Package nodehealth holds the per-node reconciler that drives each managed
// node through gpuhealth's state machine from its NodeHealthEvents.
package nodehealth
