package v1alpha1

import (
	"fmt"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Selects says whether the policy's nodeSelector selects a node with these
// labels. A nil selector selects every node (the schema defaults it); a
// selector that does not parse selects none, so a bad policy never takes
// every node.
func (p *RemediationPolicy) Selects(nodeLabels map[string]string) bool {
	sel, err := p.Selector()
	return err == nil && sel.Matches(labels.Set(nodeLabels))
}

// Selector is the policy's nodeSelector compiled once, for matching many
// nodes: everything for a nil selector, an error for one that does not
// parse (which selects no node; see Selects).
func (p *RemediationPolicy) Selector() (labels.Selector, error) {
	if p.Spec.NodeSelector == nil {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(p.Spec.NodeSelector)
}

// NamespaceSelectorError returns the first drain namespaceSelector that
// does not parse (an operator other than In, NotIn, Exists and
// DoesNotExist, In without values), naming its entry; nil when all do. The
// schema cannot check operators: the apiserver's CEL cost estimate for a
// rule over LabelSelector's unbounded lists exceeds its budget.
func (d *DrainSpec) NamespaceSelectorError() error {
	for i := range d.Namespaces {
		if sel := d.Namespaces[i].NamespaceSelector; sel != nil {
			if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
				return fmt.Errorf("drain.namespaces[%d].namespaceSelector does not parse: %w", i, err)
			}
		}
	}
	return nil
}

// ManagingPolicy returns the policy that manages a node with these labels:
// of the policies not being deleted whose nodeSelector selects it, the oldest
// (then by name), so adding a second overlapping policy never silently takes
// nodes from the first. It returns nil when none does.
func ManagingPolicy(policies []RemediationPolicy, nodeLabels map[string]string) *RemediationPolicy {
	var matching []*RemediationPolicy
	for i := range policies {
		p := &policies[i]
		if p.DeletionTimestamp == nil && p.Selects(nodeLabels) {
			matching = append(matching, p)
		}
	}
	if len(matching) == 0 {
		return nil
	}
	sort.Slice(matching, func(i, j int) bool {
		a, b := matching[i], matching[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Name < b.Name
	})
	return matching[0]
}
