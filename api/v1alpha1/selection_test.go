package v1alpha1

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestManagingPolicy(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	policy := func(name string, created metav1.Time, sel *metav1.LabelSelector, deleting bool) RemediationPolicy {
		p := RemediationPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: created}, Spec: RemediationPolicySpec{NodeSelector: sel}}
		if deleting {
			p.DeletionTimestamp = &t0
		}
		return p
	}
	gpu := &metav1.LabelSelector{MatchLabels: map[string]string{"gpu": "true"}}
	rack := &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "a"}}
	bad := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "gpu", Operator: "Bogus"}}}
	later := metav1.NewTime(t0.Add(time.Hour))
	cases := []struct {
		name     string
		policies []RemediationPolicy
		labels   map[string]string
		want     string
	}{
		{name: "no policy selects the node", policies: []RemediationPolicy{policy("p", t0, rack, false)}, labels: map[string]string{"gpu": "true"}},
		{name: "the oldest of two overlapping policies wins", policies: []RemediationPolicy{policy("new", later, rack, false), policy("old", t0, gpu, false)},
			labels: map[string]string{"gpu": "true", "rack": "a"}, want: "old"},
		{name: "equal ages are broken by name", policies: []RemediationPolicy{policy("b", t0, gpu, false), policy("a", t0, gpu, false)},
			labels: map[string]string{"gpu": "true"}, want: "a"},
		{name: "a policy being deleted manages nothing", policies: []RemediationPolicy{policy("old", t0, gpu, true), policy("new", later, gpu, false)},
			labels: map[string]string{"gpu": "true"}, want: "new"},
		{name: "a nil selector selects every node", policies: []RemediationPolicy{policy("all", t0, nil, false)}, labels: nil, want: "all"},
		{name: "a selector that does not parse selects none", policies: []RemediationPolicy{policy("bad", t0, bad, false)}, labels: map[string]string{"gpu": "true"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			got := ManagingPolicy(tc.policies, tc.labels)
			if tc.want == "" {
				g.Expect(got).To(BeNil())
				return
			}
			g.Expect(got).NotTo(BeNil())
			g.Expect(got.Name).To(Equal(tc.want))
		})
	}
}
