// Package imex is the node agent's IMEX source: on nodes that belong to a
// ComputeDomain it runs nvidia-imex-ctl to check the local IMEX daemon and
// the IMEX domain, and reports when either goes bad and when it recovers.
package imex
