// Package fsm defines gpuhealth's per-node state machine (Healthy →
// Quarantined → Draining → Recertifying → Healthy, and Failed) once, on
// looplab/fsm, and records transitions into NodeHealth status.
package fsm
