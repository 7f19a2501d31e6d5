package nodehealth

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

func TestFleetSnapshotIsReusedUntilSomethingChanges(t *testing.T) {
	h := newHarness(t)
	p := h.policy(nil)
	n := h.node("fleet-a", nil)
	h.r.snapshots = &snapshotCache{}

	managed, nhs, err := h.r.snapshot(h.ctx, p)
	h.g.Expect(err).NotTo(HaveOccurred())
	h.g.Expect(managed).To(HaveKey(n.Name))
	before := len(nhs)

	nh := &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: n.Name + "-nh"}}
	h.g.Expect(k8sClient.Create(h.ctx, nh)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(h.ctx, nh) })
	_, nhs, err = h.r.snapshot(h.ctx, p)
	h.g.Expect(err).NotTo(HaveOccurred())
	h.g.Expect(nhs).To(HaveLen(before), "nothing said the fleet changed: the snapshot is reused")

	h.r.snapshots.changed()
	_, nhs, err = h.r.snapshot(h.ctx, p)
	h.g.Expect(err).NotTo(HaveOccurred())
	h.g.Expect(nhs).To(HaveLen(before+1), "after a change the snapshot is read again")

	p.Generation++
	h.g.Expect(h.r.snapshots.snaps).To(HaveLen(1))
	_, _, err = h.r.snapshot(h.ctx, p)
	h.g.Expect(err).NotTo(HaveOccurred())
	h.g.Expect(h.r.snapshots.snaps).To(HaveLen(1), "a new policy generation replaces the policy's snapshot")
	h.g.Expect(h.r.snapshots.snaps[p.UID].generation).To(Equal(p.Generation))
}

func TestSameLabelsButPhase(t *testing.T) {
	g := NewWithT(t)
	base := map[string]string{"pool": "a"}
	withPhase := map[string]string{"pool": "a", nodepkg.PhaseLabel: "Quarantined"}
	g.Expect(sameLabelsButPhase(base, base)).To(BeTrue())
	g.Expect(sameLabelsButPhase(base, withPhase)).To(BeTrue(), "our own phase label is not a change")
	g.Expect(sameLabelsButPhase(withPhase, map[string]string{"pool": "b", nodepkg.PhaseLabel: "Quarantined"})).To(BeFalse())
	g.Expect(sameLabelsButPhase(base, map[string]string{"pool": "a", "nvidia.com/gpu.clique": "x"})).To(BeFalse())
	g.Expect(base).To(HaveLen(1), "the arguments are not modified")
}

func TestManagedNodesOfAPolicyWhoseSelectorDoesNotParse(t *testing.T) {
	h := newHarness(t)
	h.node("bad-selector", nil)
	p := &gpuhealthv1alpha1.RemediationPolicy{Spec: gpuhealthv1alpha1.RemediationPolicySpec{
		NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "test", Operator: "Bogus"}}},
	}}
	managed, err := h.r.managedNodes(h.ctx, p)
	h.g.Expect(err).NotTo(HaveOccurred())
	h.g.Expect(managed).To(BeEmpty(), "no node, also through a client that is not a cache")
}
