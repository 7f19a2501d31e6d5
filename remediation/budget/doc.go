// Package budget decides how many more nodes may go out of service under a
// count-or-percentage limit, like a PodDisruptionBudget's maxUnavailable.
package budget
