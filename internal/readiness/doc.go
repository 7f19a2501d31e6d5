// Package readiness reads the Ready condition of core objects (Node, Pod)
// for the operator, the monitors, the remediation steps and the test
// harness alike.
package readiness
