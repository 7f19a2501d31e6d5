package drain_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/drain"
)

// TestDrainWakesTheNodeWhenItsPodsLeave: a pass that leaves pods on a node
// watches them on the apiserver, and each one that goes wakes the node;
// the pass that finds the node empty ends the watch, and other nodes'
// pods never wake it.
func TestDrainWakesTheNodeWhenItsPodsLeave(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node, other := ns+"-node", ns+"-other"
	newPod(t, ns, "a", node)
	newPod(t, ns, "b", node)
	newPod(t, ns, "elsewhere", other)
	d := drain.New(k8sClient, k8sClient, clocktesting.NewFakeClock(epoch), operatorNamespace)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- d.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})
	woken := func() []string {
		var names []string
		for {
			select {
			case ev := <-d.Wakeups():
				names = append(names, ev.Object.GetName())
			case <-time.After(300 * time.Millisecond):
				return names
			}
		}
	}

	// The first pass evicts both pods; a pass after Start has begun (the
	// first may come before) watches them from its list.
	res, err := d.Drain(ctx, node, gpuhealthv1alpha1.DrainSpec{}, epoch)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Evicted).To(Equal(2))
	g.Eventually(func() bool {
		_, err := d.Drain(ctx, node, gpuhealthv1alpha1.DrainSpec{}, epoch)
		g.Expect(err).NotTo(HaveOccurred())
		return d.Watching(node)
	}).Should(BeTrue())
	g.Expect(d.Watching(other)).To(BeFalse())

	// The kubelet removes the pods: the node is woken, by name.
	playKubelet(t, node)
	g.Eventually(woken, 5*time.Second).Should(ContainElement(node))

	// Another node's pod going wakes nothing.
	g.Expect(k8sClient.Delete(ctx, getPod(t, ns, "elsewhere"), client.GracePeriodSeconds(0))).To(Succeed())
	g.Expect(woken()).To(BeEmpty())

	// The pass that finds the node empty ends its watch: a pod that comes
	// and goes afterwards wakes nothing.
	res, err = d.Drain(ctx, node, gpuhealthv1alpha1.DrainSpec{}, epoch)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Done()).To(BeTrue())
	g.Expect(d.Watching(node)).To(BeFalse())
	newPod(t, ns, "late", node)
	g.Expect(k8sClient.Delete(ctx, getPod(t, ns, "late"), client.GracePeriodSeconds(0))).To(Succeed())
	g.Consistently(d.Wakeups(), time.Second).ShouldNot(Receive(BeAssignableToTypeOf(event.GenericEvent{})))
}
