package nodehealth

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
)

// listCounter counts the NodeHealth lists made through it.
type listCounter struct {
	client.Reader
	lists atomic.Int32
}

func (c *listCounter) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if _, ok := list.(*gpuhealthv1alpha1.NodeHealthList); ok {
		c.lists.Add(1)
	}
	return c.Reader.List(ctx, list, opts...)
}

// TestAdmissionsShareOneListAndNeverOverrun: five nodes fail at once under
// a budget of three. The three drains admitted one after another reuse one
// list of the NodeHealths from the apiserver (with the phases written since
// laid over it), where each listed before; the other two are refused on the
// first count (this harness reads without a cache, so that count is
// current); exactly three nodes take the budget.
func TestAdmissionsShareOneListAndNeverOverrun(t *testing.T) {
	h := newHarness(t)
	counter := &listCounter{Reader: h.r.APIReader}
	h.r.APIReader = counter
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Budgets.MaxUnavailable = ptr.To(intstrFromInt(3))
		s.Recertification.Job = jobTemplate()
		s.CircuitBreaker.Enabled = ptr.To(false)
	})
	var names []string
	for _, suffix := range []string{"a", "b", "c", "d", "e"} {
		n := h.node(suffix, nil)
		names = append(names, n.Name)
		h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	}
	for _, n := range names {
		h.reconcile(n)
	}
	out, waiting := 0, 0
	for _, n := range names {
		switch h.phase(n) {
		case gpuhealthv1alpha1.PhaseDraining, gpuhealthv1alpha1.PhaseRecertifying:
			out++
		case quarantined:
			waiting++
			h.g.Expect(h.nodeHealth(n).Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonWaitingForBudget))
		}
	}
	h.g.Expect(out).To(Equal(3), "the budget's three, not one more")
	h.g.Expect(waiting).To(Equal(2))
	h.g.Expect(counter.lists.Load()).To(Equal(int32(1)), "one list for the three admissions (three without the recent list)")
}

// TestRecentListCountsADomainMemberItAdmitted: two members of one
// ComputeDomain fail together under maxUnavailablePerComputeDomain 1, and
// neither had written its membership before. The first is admitted and
// writes its phase and its membership in one write; the second's count,
// within the recent list's lifetime and from a budget snapshot that has not
// seen that write (a lagging cache), must still count the first against the
// domain and wait.
func TestRecentListCountsADomainMemberItAdmitted(t *testing.T) {
	h := newHarness(t)
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.CircuitBreaker.Enabled = ptr.To(false)
		s.Budgets.MaxUnavailable = ptr.To(intstrFromInt(10))
		s.Budgets.MaxUnavailablePerComputeDomain = ptr.To(intstrFromInt(1))
		s.Budgets.MaxUnavailablePerClique = ptr.To(intstrFromInt(10))
		s.Recertification.Job = jobTemplate()
	})
	e := h.withComputeDomains(testenv.DriverShapes()[0])
	d := e.domain("d")
	n1, n2 := h.node("a", nil).Name, h.node("b", nil).Name
	for _, n := range []string{n1, n2} {
		e.join(n, d, h.label+".c")
		e.waitListed(n, true)
		h.fault(n, gpuhealthv1alpha1.CheckXID, "79")
	}
	// A snapshot that is never told of a change: the cache lags.
	h.r.snapshots = &snapshotCache{}

	h.reconcile(n1)
	h.g.Expect(h.phase(n1)).To(Equal(draining))
	h.g.Expect(h.nodeHealth(n1).Status.ComputeDomain).NotTo(BeNil())
	h.reconcile(n2)
	nh := h.nodeHealth(n2)
	h.g.Expect(nh.Status.Phase).To(Equal(quarantined), "the first member's drain holds the domain's only slot")
	h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonWaitingForBudget))
	h.g.Expect(nh.Status.BlockingBudget).To(Equal(gpuhealthv1alpha1.BudgetPerComputeDomain))
}

// slowLists steps the harness's clock by took at each NodeHealth list, as a
// list of thousands of NodeHealths takes seconds.
type slowLists struct {
	*listCounter
	step func()
}

func (c *slowLists) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if _, ok := list.(*gpuhealthv1alpha1.NodeHealthList); ok {
		c.step()
	}
	return c.listCounter.List(ctx, list, opts...)
}

// TestASlowListServesLonger: where listing the NodeHealths takes 3 s, the
// list serves the admissions of the next 14 s (2 s and four times its
// cost), where a fixed 2 s had every admission of a wave list again; past
// that, the next admission lists afresh.
func TestASlowListServesLonger(t *testing.T) {
	h := newHarness(t)
	counter := &slowLists{listCounter: &listCounter{Reader: h.r.APIReader}, step: func() { h.clock.Step(3 * time.Second) }}
	h.r.APIReader = counter
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Budgets.MaxUnavailable = ptr.To(intstrFromInt(5))
		s.Recertification.Job = jobTemplate()
		s.CircuitBreaker.Enabled = ptr.To(false)
	})
	var names []string
	for _, suffix := range []string{"a", "b", "c"} {
		n := h.node(suffix, nil)
		names = append(names, n.Name)
		h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	}
	h.reconcile(names[0])
	h.g.Expect(counter.lists.Load()).To(Equal(int32(1)))
	h.clock.Step(8 * time.Second) // 11 s after the list began
	h.reconcile(names[1])
	h.g.Expect(counter.lists.Load()).To(Equal(int32(1)), "within 2 s + 4 × 3 s of the list: reused")
	h.clock.Step(20 * time.Second)
	h.reconcile(names[2])
	h.g.Expect(counter.lists.Load()).To(Equal(int32(2)), "past it: listed again")
	for _, n := range names {
		h.g.Expect(h.phase(n)).To(BeElementOf(gpuhealthv1alpha1.PhaseDraining, gpuhealthv1alpha1.PhaseRecertifying))
	}
}

func TestRecentListServes(t *testing.T) {
	g := NewWithT(t)
	g.Expect(recentListServes(0)).To(Equal(2*time.Second), "a quick list serves 2 s")
	g.Expect(recentListServes(time.Second)).To(Equal(6 * time.Second))
	g.Expect(recentListServes(time.Minute)).To(Equal(30*time.Second), "bounded")
	g.Expect(recentListServes(-time.Second)).To(Equal(2*time.Second), "a clock that went back")
}
