package budget

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// DefaultMaxUnavailable is a policy's maxUnavailable when it sets none.
var DefaultMaxUnavailable = intstr.FromString("10%")

// Limit resolves a count or percentage of total into a number of nodes.
// Percentages round up, as a PodDisruptionBudget's maxUnavailable does, so
// 10% of 3 nodes is 1. A nil limit means def. A malformed value fails closed
// (0 nodes) and returns an error, so a bad budget never lets every node go.
func Limit(v *intstr.IntOrString, total int, def intstr.IntOrString) (int, error) {
	if v == nil {
		v = &def
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(v, total, true)
	if err != nil {
		return 0, fmt.Errorf("resolving budget %q: %w", v.String(), err)
	}
	if n < 0 {
		return 0, fmt.Errorf("resolving budget %q: negative", v.String())
	}
	return n, nil
}

// Decision is the outcome of one budget check.
type Decision struct {
	// Name names the budget, as in the policy ("maxUnavailable").
	Name string
	// Limit is the resolved limit in nodes.
	Limit int
	// Consuming is how many nodes already use the budget.
	Consuming int
	// Total is how many nodes the budget is a share of.
	Total int
	// Scope names what the budget is counted over ("ComputeDomain ml/train",
	// "clique 9f3c.1"); empty for all managed nodes.
	Scope string
}

// Allowed is how many more nodes may start: limit − consuming, at least 0.
func (d Decision) Allowed() int { return max(d.Limit-d.Consuming, 0) }

// Message explains the decision with the numbers a human needs.
func (d Decision) Message() string {
	if d.Scope != "" {
		return fmt.Sprintf("%d of %d nodes of %s unavailable, %s %d", d.Consuming, d.Total, d.Scope, d.Name, d.Limit)
	}
	return fmt.Sprintf("%d of %d nodes unavailable, %s %d", d.Consuming, d.Total, d.Name, d.Limit)
}

// Full names a budget without room by what changes only with the policy
// (its name, resolved limit and scope), not by the live counts: a node
// waiting for it records this, so a node joining the fleet or another node
// finishing does not rewrite the status of every waiting node. The counts
// are in the policy's status and in Message.
func (d Decision) Full() string {
	if d.Scope != "" {
		return fmt.Sprintf("no room under %s %d in %s", d.Name, d.Limit, d.Scope)
	}
	return fmt.Sprintf("no room under %s %d", d.Name, d.Limit)
}
