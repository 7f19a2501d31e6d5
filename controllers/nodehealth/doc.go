// Package nodehealth holds the per-node reconciler that drives each managed
// node through gpuhealth's state machine from its NodeHealthEvents.
//
// A pass (Reconcile, controller.go) is five steps, each in its own files:
//
//   - observe (observe*.go) reads the node's world into an observation and
//     writes nothing; which costly inputs it reads is decide's to say
//     (inputsFor).
//   - decide (decide*.go) is a pure function from the observation to a
//     plan: what to write, what to do, what to ask for, what to announce
//     after the write, and how to go on.
//   - admit (admission.go) takes the shared, counted resources the plan
//     asks for — a quarantine from the circuit breaker, a budget slot
//     counted again from the apiserver under a lock — and decides again on
//     what it found.
//   - apply (apply.go) carries out the plan's acts, each idempotent.
//   - record (record.go) writes the findings' statuses and the NodeHealth
//     status once, then publishes the plan's Events and counts its metrics.
//
// The watches that wake a node are in watches.go; the per-node gauges,
// built at each scrape from the cache, in goodput.go.
package nodehealth
