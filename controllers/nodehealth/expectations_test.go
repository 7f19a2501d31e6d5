package nodehealth

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// TestExpectations: the cache is behind while it shows the version read
// before our write, caught up once it shows any other, and an expectation
// lapses after expectationTimeout.
func TestExpectations(t *testing.T) {
	g := NewWithT(t)
	clk := clocktesting.NewFakeClock(t0)
	e := newExpectations(clk)
	at := func(rv string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: rv}}
	}
	g.Expect(e.caughtUp(kindNode, "n", at("1"))).To(BeTrue(), "nothing written")
	e.wrote(kindNode, "n", "1", "2")
	g.Expect(e.caughtUp(kindNode, "n", at("1"))).To(BeFalse(), "the cache shows the version we wrote over")
	g.Expect(e.caughtUp(kindNodeHealth, "n", at("1"))).To(BeTrue(), "kinds are apart")
	g.Expect(e.caughtUp(kindNode, "n", at("2"))).To(BeTrue(), "another version: our write or a later one")
	g.Expect(e.caughtUp(kindNode, "n", at("1"))).To(BeTrue(), "forgotten once caught up")

	e.wrote(kindNode, "n", "3", "4")
	clk.Step(expectationTimeout)
	g.Expect(e.caughtUp(kindNode, "n", at("3"))).To(BeTrue(), "a lost expectation lapses")

	e.wrote(kindNode, "n", "4", "5")
	e.forget(kindNode, "n")
	g.Expect(e.caughtUp(kindNode, "n", at("4"))).To(BeTrue(), "a deleted node's expectations go")

	var nilExp *expectations
	nilExp.wrote(kindNode, "n", "1", "2")
	g.Expect(nilExp.caughtUp(kindNode, "n", at("1"))).To(BeTrue())

	// Expectations never checked again are swept once lapsed.
	for i := range sweepAt {
		e.wrote(kindHealthEvent, time.Duration(i).String(), "1", "2")
	}
	clk.Step(expectationTimeout)
	e.wrote(kindNode, "n", "5", "6")
	g.Expect(e.stale).To(HaveLen(1))

	// A write the apiserver answered with the version it had changed
	// nothing: there is nothing for the cache to catch up with.
	e.wrote(kindNodeHealth, "n", "7", "7")
	g.Expect(e.caughtUp(kindNodeHealth, "n", at("7"))).To(BeTrue(), "a no-op write expects nothing")
}

// A status write the apiserver takes as no change (the plan's time differs
// from the stored one below the second the API keeps) answers with the
// version read: record expects nothing, and the next pass decides at once
// instead of waiting expectationTimeout for a version that never comes.
func TestNoOpStatusWriteExpectsNothing(t *testing.T) {
	h := newHarness(t)
	name := h.label + "-noop"
	since := metav1.NewTime(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	nh := &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: name}}
	h.g.Expect(k8sClient.Create(h.ctx, nh)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), nh) })
	nh.Status.Phase, nh.Status.Since = gpuhealthv1alpha1.PhaseHealthy, &since
	h.g.Expect(k8sClient.Status().Update(h.ctx, nh)).To(Succeed())

	p := &plan{}
	p.status = *nh.Status.DeepCopy()
	p.status.Since = &metav1.Time{Time: since.Add(time.Millisecond)}
	o := &observation{node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, nh: nh.DeepCopy()}
	written, err := h.r.record(h.ctx, o, p)
	h.g.Expect(err).NotTo(HaveOccurred())
	h.g.Expect(written).To(BeTrue())
	var after gpuhealthv1alpha1.NodeHealth
	h.g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(nh), &after)).To(Succeed())
	h.g.Expect(after.ResourceVersion).To(Equal(nh.ResourceVersion), "the apiserver saw no change")
	h.g.Expect(h.r.expect.caughtUp(kindNodeHealth, name, &after)).To(BeTrue(), "a no-op write left an expectation")
}
