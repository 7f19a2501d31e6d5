// Package policy keeps each RemediationPolicy's status current: how many
// nodes it manages and how many are in each phase.
package policy
