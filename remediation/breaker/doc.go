// Package breaker is the quarantine circuit breaker: when too many nodes
// enter quarantine inside a window it opens and refuses new quarantines
// until a cool-down passes or a human resets it. Recoveries never pass
// through it.
package breaker
