package drain

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRefuseTrustsOnlyACurrentSingleBudget checks which evictions are
// refused without a request: only Ready pods under exactly one budget whose
// status is current, beyond the disruptions that budget allows.
func TestRefuseTrustsOnlyACurrentSingleBudget(t *testing.T) {
	g := NewWithT(t)
	pdb := func(name string, app string, generation, observed int64, allowed int32) policyv1.PodDisruptionBudget {
		return policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Generation: generation},
			Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}},
			Status:     policyv1.PodDisruptionBudgetStatus{ObservedGeneration: observed, DisruptionsAllowed: allowed},
		}
	}
	pod := func(name, app string, ready bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{"app": app}}}
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
		return p
	}
	c := &budgetCache{byNamespace: map[string][]policyv1.PodDisruptionBudget{"ns": {
		pdb("web", "web", 1, 1, 1),       // current, one disruption allowed
		pdb("stale", "stale", 2, 1, 0),   // status older than the spec
		pdb("both-a", "both", 1, 1, 0),   // two budgets select the same pods:
		pdb("both-b", "both", 1, 1, 0),   // the apiserver refuses with its own error
		pdb("closed", "closed", 1, 1, 0), // current, none allowed
	}}}
	tasks := []task{
		{pod: pod("web-0", "web", true)},
		{pod: pod("web-1", "web", true)},       // beyond the one allowed
		{pod: pod("web-2", "web", false)},      // not Ready: the apiserver may allow it
		{pod: pod("closed-0", "closed", true)}, // none allowed
		{pod: pod("closed-1", "closed", true), delete: true, expired: true},
		{pod: pod("stale-0", "stale", true)},
		{pod: pod("both-0", "both", true)},
		{pod: pod("free-0", "free", true)}, // no budget
	}
	l := newLedger()
	out, admitted := c.refuse(t.Context(), l, tasks)
	refused := map[string]string{}
	for i, o := range out {
		if o != nil {
			g.Expect(o.kind).To(Equal(outcomeBlocked))
			refused[tasks[i].pod.Name] = o.message
		}
	}
	g.Expect(refused).To(HaveLen(2))
	g.Expect(admitted[0]).NotTo(BeNil()) // web-0, counted against web
	for i := 1; i < len(tasks); i++ {
		g.Expect(admitted[i]).To(BeNil(), tasks[i].pod.Name)
	}
	g.Expect(refused).To(HaveKeyWithValue("web-1", ContainSubstring("PodDisruptionBudget web allows 1 disruptions")))
	g.Expect(refused).To(HaveKeyWithValue("closed-0", ContainSubstring("PodDisruptionBudget closed allows 0 disruptions")))
	for _, m := range refused {
		g.Expect(m).To(ContainSubstring("would violate the pod's disruption budget"))
		g.Expect(len(m)).To(BeNumerically("<=", maxMessageLen))
	}
}

// TestLedgerSharesABudgetAcrossPasses checks that concurrent passes of
// different nodes together admit no more evictions than a budget allows
// until the cache shows it change, and that an admission whose eviction
// did not go through is given back.
func TestLedgerSharesABudgetAcrossPasses(t *testing.T) {
	g := NewWithT(t)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", ResourceVersion: "10"}}
	pdb.Status.DisruptionsAllowed = 2
	l := newLedger()
	first, ok := l.admit(pdb)
	g.Expect(ok).To(BeTrue())
	_, ok = l.admit(pdb) // another node's pass
	g.Expect(ok).To(BeTrue())
	_, ok = l.admit(pdb)
	g.Expect(ok).To(BeFalse(), "a third eviction before the budget changes")

	// The first eviction found no token: its admission comes back.
	l.release(first)
	_, ok = l.admit(pdb)
	g.Expect(ok).To(BeTrue())

	// The cache shows the budget changed (the apiserver's decrement, or the
	// disruption controller's count): counting starts over from it.
	changed := pdb.DeepCopy()
	changed.ResourceVersion, changed.Status.DisruptionsAllowed = "11", 1
	stale, ok := l.admit(changed)
	g.Expect(ok).To(BeTrue())
	_, ok = l.admit(changed)
	g.Expect(ok).To(BeFalse())
	// An admission of an older version changes nothing when given back.
	l.release(admission{key: stale.key, resourceVersion: "10"})
	_, ok = l.admit(changed)
	g.Expect(ok).To(BeFalse())
}
