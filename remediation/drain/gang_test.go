package drain_test

import (
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/drain"
	"github.com/gpuhealth/gpuhealth/remediation/gang"
)

var gangSpec = gpuhealthv1alpha1.DrainSpec{Gangs: gpuhealthv1alpha1.GangDrainGang}

// jobSetMember labels a pod as JobSet name's restart 0 does.
func jobSetMember(name string) podOption {
	return withLabels(map[string]string{"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/restart-attempt": "0", "app": name})
}

// withGPUs has the pod's container ask for n nvidia.com/gpu.
func withGPUs(n int) podOption {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(int64(n), resource.DecimalSI)}
	}
}

// newGang makes a JobSet-shaped gang of one running pod (with 8 GPUs) on
// each of nodes, named <name>-<i>.
func newGang(t *testing.T, ns, name string, nodes ...string) {
	t.Helper()
	for i, n := range nodes {
		newPod(t, ns, fmt.Sprintf("%s-%d", name, i), n, jobSetMember(name), withGPUs(8), running())
	}
}

func terminating(t *testing.T, ns string, names ...string) []string {
	t.Helper()
	var out []string
	for _, n := range names {
		if getPod(t, ns, n).DeletionTimestamp != nil {
			out = append(out, n)
		}
	}
	return out
}

// A member on the draining node takes every member, on every node, with
// it in one pass; a pod of no gang leaves as ever, another gang with no
// member on the node stays, and a replacement made after the drain began
// is never part of the wave.
func TestGangWaveEvictsEveryMemberOnEveryNodeInOnePass(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node := ns + "-n0"
	peers := []string{ns + "-n1", ns + "-n2", ns + "-n3"}
	newGang(t, ns, "llama", append([]string{node}, peers...)...)
	newGang(t, ns, "other", peers...)
	newPod(t, ns, "web", node, running())
	// The drain began in the second the ranks were made, as the
	// NodeHealth keeps it (to the second): they are all of the gang.
	started := getPod(t, ns, "llama-3").CreationTimestamp.Time
	d := drain.New(k8sClient, k8sClient, clocktesting.NewFakeClock(started), operatorNamespace)

	res, err := d.Drain(t.Context(), node, gangSpec, started)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Total).To(Equal(2), "the node's own pods: llama-0 and web")
	g.Expect(res.Evicted).To(Equal(2))
	g.Expect(res.Waves).To(HaveLen(1))
	w := res.Waves[0]
	g.Expect(w.Key).To(Equal(gang.Key{Kind: gang.JobSet, Namespace: ns, Name: "llama", Part: "0"}))
	g.Expect(w.Owner).To(Equal(gang.Owner{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "llama"}))
	g.Expect(w.Members).To(Equal(4))
	g.Expect(w.SpannedNodes).To(Equal(4))
	g.Expect(w.Nodes).To(Equal(append([]string{node}, peers...)))
	g.Expect(w.Evicted).To(Equal(4))
	g.Expect(w.PeerGPUs).To(Equal(24), "three peers of 8 GPUs")
	g.Expect(w.Held).To(BeEmpty())
	g.Expect(terminating(t, ns, "llama-0", "llama-1", "llama-2", "llama-3", "web")).To(HaveLen(5))
	g.Expect(terminating(t, ns, "other-0", "other-1", "other-2")).To(BeEmpty())

	// The JobSet's controller would now recreate its Jobs; a pod made after
	// the drain began (in a later second: creation times are kept to the
	// second), on a healthy node, is not evicted by the next pass.
	time.Sleep(time.Until(started.Truncate(time.Second).Add(time.Second)))
	newPod(t, ns, "llama-new", peers[0], jobSetMember("llama"), running())
	res, err = d.Drain(t.Context(), node, gangSpec, started)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Evicted).To(Equal(0))
	g.Expect(terminating(t, ns, "llama-new")).To(BeEmpty())
	playKubelet(t, node)
	res, err = d.Drain(t.Context(), node, gangSpec, started)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Done()).To(BeTrue())
	g.Expect(res.Waves).To(BeEmpty())
}

// Pods mode (the default) for contrast: the node's member leaves alone.
func TestPodsModeEvictsOnlyTheNodesMember(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node := ns + "-n0"
	newGang(t, ns, "llama", node, ns+"-n1", ns+"-n2")
	started := time.Now()
	d := drain.New(k8sClient, k8sClient, clocktesting.NewFakeClock(started), operatorNamespace)

	res, err := d.Drain(t.Context(), node, gpuhealthv1alpha1.DrainSpec{}, started)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(drain.Result{Total: 1, Remaining: 1, Evicted: 1}))
	g.Expect(terminating(t, ns, "llama-0", "llama-1", "llama-2")).To(Equal([]string{"llama-0"}))

	// A namespace entry can ask for waves where the default is Pods.
	ns2 := newNamespace(t, nil)
	node2 := ns2 + "-n0"
	newGang(t, ns2, "llama", node2, ns2+"-n1")
	spec := gpuhealthv1alpha1.DrainSpec{Namespaces: []gpuhealthv1alpha1.NamespaceDrain{{Namespace: ns2, Mode: gpuhealthv1alpha1.DrainEvict, Gangs: gpuhealthv1alpha1.GangDrainGang}}}
	res, err = d.Drain(t.Context(), node2, spec, started)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Waves).To(HaveLen(1))
	g.Expect(terminating(t, ns2, "llama-0", "llama-1")).To(HaveLen(2))
}

// A member whose PodDisruptionBudget allows no disruption holds the whole
// wave: nothing of the gang is evicted, the node's member is reported
// blocked by it, until the budget allows it; past the drain timeout the
// members the budgets allow go.
func TestABlockedMemberHoldsTheWave(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node := ns + "-n0"
	newGang(t, ns, "llama", node, ns+"-n1", ns+"-n2")
	newPod(t, ns, "llama-guarded", ns+"-n3", jobSetMember("llama"), withLabels(map[string]string{
		"jobset.sigs.k8s.io/jobset-name": "llama", "jobset.sigs.k8s.io/restart-attempt": "0", "guard": "yes"}), running())
	pdb := newPDB(t, ns, "guard", map[string]string{"guard": "yes"})
	setDisruptionsAllowed(t, pdb, 0)
	started := time.Now()
	clk := clocktesting.NewFakeClock(started)
	d := drain.New(k8sClient, k8sClient, clk, operatorNamespace)
	spec := gangSpec
	spec.Timeout = ptr.To(gpuhealthv1alpha1.Duration("1h"))

	res, err := d.Drain(t.Context(), node, spec, started)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Evicted).To(Equal(0))
	g.Expect(res.Blocked).To(Equal(1))
	g.Expect(res.Remaining).To(Equal(1))
	g.Expect(res.Waves).To(HaveLen(1))
	g.Expect(res.Waves[0].Held).To(And(ContainSubstring("llama-guarded"), ContainSubstring(ns+"-n3"), ContainSubstring("guard")))
	g.Expect(res.BlockedPods).To(HaveLen(1))
	g.Expect(res.BlockedPods[0].Message).To(ContainSubstring("held by member"))
	g.Expect(terminating(t, ns, "llama-0", "llama-1", "llama-2", "llama-guarded")).To(BeEmpty())

	// Past the drain timeout the wave goes without it: the node no longer
	// waits for the guarded member, which is reported and still tried.
	clk.Step(2 * time.Hour)
	res, err = d.Drain(t.Context(), node, spec, started)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Waves[0].Held).To(BeEmpty())
	g.Expect(terminating(t, ns, "llama-0", "llama-1", "llama-2")).To(HaveLen(3))
	g.Expect(terminating(t, ns, "llama-guarded")).To(BeEmpty())
	g.Expect(res.WavePending).To(Equal(0))
	g.Expect(res.Waves[0].Late).To(Equal(1))
	g.Expect(res.TimedOutPods).To(ContainElement(HaveField("Name", "llama-guarded")))
	g.Expect(res.Done()).To(BeFalse(), "the node's own member is still terminating")

	// The node's own member gone, the drain is done, and while the node
	// is still passed the wave goes on for the guarded one.
	playKubelet(t, node)
	res, err = d.Drain(t.Context(), node, spec, started)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Done()).To(BeTrue())
	setDisruptionsAllowed(t, pdb, 1)
	_, err = d.Drain(t.Context(), node, spec, started)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(terminating(t, ns, "llama-guarded")).To(HaveLen(1))
}

// A wave once begun is never held again: a member whose eviction the
// apiserver refused (two budgets select it, which the Eviction API does
// not support) is tried in the next passes, and the drain waits for it,
// even once the cache shows its one budget allowing no disruption.
func TestABegunWaveIsNotHeldAgain(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node := ns + "-n0"
	newGang(t, ns, "llama", node, ns+"-n1")
	newPod(t, ns, "llama-guarded", ns+"-n2", withLabels(map[string]string{
		"jobset.sigs.k8s.io/jobset-name": "llama", "jobset.sigs.k8s.io/restart-attempt": "0", "guard": "yes"}), running())
	pdb := newPDB(t, ns, "guard", map[string]string{"guard": "yes"})
	setDisruptionsAllowed(t, pdb, 1)
	second := newPDB(t, ns, "guard-too", map[string]string{"guard": "yes"})
	setDisruptionsAllowed(t, second, 1)
	started := time.Now()
	d := drain.New(k8sClient, k8sClient, clocktesting.NewFakeClock(started), operatorNamespace)

	res, err := d.Drain(t.Context(), node, gangSpec, started)
	g.Expect(err).To(MatchError(ContainSubstring("llama-guarded")), "the apiserver refused it")
	g.Expect(res.Waves).To(HaveLen(1))
	g.Expect(res.Waves[0].Held).To(BeEmpty(), "sent: the cache could not say no")
	g.Expect(terminating(t, ns, "llama-0", "llama-1")).To(HaveLen(2))
	g.Expect(terminating(t, ns, "llama-guarded")).To(BeEmpty())
	g.Expect(res.WavePending).To(Equal(1))

	// The node's member gone and one budget left, at no disruption: the
	// wave is not held (and forgotten), the drain waits for the member.
	playKubelet(t, node)
	g.Expect(k8sClient.Delete(t.Context(), second)).To(Succeed())
	setDisruptionsAllowed(t, pdb, 0)
	res, err = d.Drain(t.Context(), node, gangSpec, started)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Waves).To(HaveLen(1))
	g.Expect(res.Waves[0].Held).To(BeEmpty())
	g.Expect(res.WavePending).To(Equal(1))
	g.Expect(res.Done()).To(BeFalse())

	setDisruptionsAllowed(t, pdb, 1)
	res, err = d.Drain(t.Context(), node, gangSpec, started)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(terminating(t, ns, "llama-guarded")).To(HaveLen(1))
	g.Expect(res.Done()).To(BeTrue())
}

// A gang spanning two draining nodes is evicted once: the second node's
// pass finds its member already leaving and sends nothing.
func TestAGangOnTwoDrainingNodesIsEvictedOnce(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	a, b := ns+"-a", ns+"-b"
	newGang(t, ns, "llama", a, b, ns+"-c")
	started := time.Now()
	d := drain.New(k8sClient, k8sClient, clocktesting.NewFakeClock(started), operatorNamespace)

	res, err := d.Drain(t.Context(), a, gangSpec, started)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Waves).To(HaveLen(1))
	g.Expect(res.Waves[0].Evicted).To(Equal(3))
	res, err = d.Drain(t.Context(), b, gangSpec, started)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Evicted).To(Equal(0))
	g.Expect(res.Remaining).To(Equal(1), "its member is terminating")
	g.Expect(res.Waves).To(BeEmpty(), "no wave of its own")
}

// drain.gangGracePeriod lengthens a member's grace period: the apiserver
// takes the eviction's DeleteOptions.gracePeriodSeconds over the pod's own
// terminationGracePeriodSeconds, longer or shorter, and the kubelet kills
// by the pod's deletionGracePeriodSeconds. A pod whose own is longer keeps it.
func TestGangGracePeriodLengthensAShorterGrace(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node := ns + "-n0"
	newPod(t, ns, "short", node, jobSetMember("llama"), running(), func(p *corev1.Pod) { p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](5) })
	newPod(t, ns, "long", ns+"-n1", jobSetMember("llama"), running(), func(p *corev1.Pod) { p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](900) })
	newPod(t, ns, "unset", ns+"-n2", jobSetMember("llama"), running())
	started := time.Now()
	d := drain.New(k8sClient, k8sClient, clocktesting.NewFakeClock(started), operatorNamespace)
	spec := gangSpec
	spec.GangGracePeriod = ptr.To(gpuhealthv1alpha1.Duration("10m"))

	_, err := d.Drain(t.Context(), node, spec, started)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(getPod(t, ns, "short").DeletionGracePeriodSeconds).To(HaveValue(BeEquivalentTo(600)))
	g.Expect(getPod(t, ns, "unset").DeletionGracePeriodSeconds).To(HaveValue(BeEquivalentTo(600)))
	g.Expect(getPod(t, ns, "long").DeletionGracePeriodSeconds).To(HaveValue(BeEquivalentTo(900)))
}

// drain.kueue Kueue leaves a Kueue-managed gang to Kueue: only its member
// on the node leaves; a gang Kueue does not manage still goes whole.
func TestKueueGangsAreLeftToKueueWhenThePolicySaysSo(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node := ns + "-n0"
	queued := withLabels(map[string]string{"jobset.sigs.k8s.io/jobset-name": "queued", "jobset.sigs.k8s.io/restart-attempt": "0", "kueue.x-k8s.io/queue-name": "team-a"})
	newPod(t, ns, "queued-0", node, queued, running())
	newPod(t, ns, "queued-1", ns+"-n1", queued, running())
	newGang(t, ns, "free", node, ns+"-n1")
	started := time.Now()
	d := drain.New(k8sClient, k8sClient, clocktesting.NewFakeClock(started), operatorNamespace)
	spec := gangSpec
	spec.Kueue = gpuhealthv1alpha1.KueueGangsKueue

	res, err := d.Drain(t.Context(), node, spec, started)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Waves).To(HaveLen(1))
	g.Expect(res.Waves[0].Key.Name).To(Equal("free"))
	g.Expect(terminating(t, ns, "queued-0", "queued-1", "free-0", "free-1")).To(ConsistOf("queued-0", "free-0", "free-1"))
}
