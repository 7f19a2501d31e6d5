package nodehealth

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/reference"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/computedomain"
	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
)

const driverNamespace = "nvidia-dra-driver"

// recorded is one Event, with the object it is about.
type recorded struct {
	kind, namespace, name, eventType, reason, note string
}

// refRecorder keeps every Event with its regarding object, so a test can
// assert what `kubectl describe computedomain` would show.
type refRecorder struct {
	mu     sync.Mutex
	events []recorded
}

func (r *refRecorder) Eventf(regarding, _ runtime.Object, eventType, reason, _, note string, args ...any) {
	ref, err := reference.GetReference(testScheme, regarding)
	if err != nil {
		panic(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, recorded{kind: ref.Kind, namespace: ref.Namespace, name: ref.Name, eventType: eventType, reason: reason, note: fmt.Sprintf(note, args...)})
}

// on returns the reasons of the Events about kind namespace/name, in order.
func (r *refRecorder) on(kind, namespace, name string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		if e.kind == kind && e.namespace == namespace && e.name == name {
			out = append(out, e.reason)
		}
	}
	return out
}

// cdEnv plays NVIDIA's DRA driver for one test, in one of its API shapes:
// ComputeDomains, cliques (v25.12 and later) or status.nodes entries
// (v25.8), node labels and daemon pods, and runs the view over them.
type cdEnv struct {
	h     *harness
	shape testenv.DriverShape
	view  *computedomain.View
	rec   *refRecorder
	// cliques holds the clique objects by "<uid>.<cliqueID>".
	cliques map[string]*unstructured.Unstructured
	// domains holds the ComputeDomain objects by UID.
	domains map[types.UID]*unstructured.Unstructured
}

// entry is the trace a membership list entry leaves in this shape.
func (e *cdEnv) entry() gpuhealthv1alpha1.MembershipTrace {
	if e.shape.Cliques {
		return gpuhealthv1alpha1.TraceCliqueEntry
	}
	return gpuhealthv1alpha1.TraceStatusEntry
}

// traces returns the expected traces, sorted as NodeHealth lists them,
// with CliqueEntry standing for this shape's list entry.
func (e *cdEnv) traces(ts ...gpuhealthv1alpha1.MembershipTrace) []gpuhealthv1alpha1.MembershipTrace {
	out := make([]gpuhealthv1alpha1.MembershipTrace, 0, len(ts))
	for _, t := range ts {
		if t == gpuhealthv1alpha1.TraceCliqueEntry {
			t = e.entry()
		}
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// withComputeDomains starts a cache and a ComputeDomain view for the
// reconciler and records Events with their objects.
func (h *harness) withComputeDomains(shape testenv.DriverShape) *cdEnv {
	h.t.Helper()
	h.g.Expect(testenv.UseDriverShape(testEnv.Config, k8sClient, shape)).To(Succeed())
	c, err := cache.New(testEnv.Config, cache.Options{Scheme: testScheme})
	h.g.Expect(err).NotTo(HaveOccurred())
	disc, err := discovery.NewDiscoveryClientForConfig(testEnv.Config)
	h.g.Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(context.Background())
	h.t.Cleanup(cancel)
	go func() { _ = c.Start(ctx) }()
	v := computedomain.NewView(c, disc, clock.RealClock{}, driverNamespace)
	v.PollInterval = 50 * time.Millisecond
	go func() { _ = v.Start(ctx) }()
	go func() { // the node controller's channel source, here a sink
		for {
			select {
			case <-v.Changes():
			case <-ctx.Done():
				return
			}
		}
	}()
	h.g.Eventually(v.Available, 10*time.Second, 20*time.Millisecond).Should(BeTrue())
	if err := k8sClient.Create(h.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: driverNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		h.g.Expect(err).NotTo(HaveOccurred())
	}
	rec := &refRecorder{}
	h.r.ComputeDomains, h.r.Recorder = v, rec
	return &cdEnv{h: h, shape: shape, view: v, rec: rec, cliques: map[string]*unstructured.Unstructured{}, domains: map[types.UID]*unstructured.Unstructured{}}
}

// domain creates a Ready ComputeDomain in the default namespace.
func (e *cdEnv) domain(name string) types.UID {
	e.h.t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(computedomain.ComputeDomainGVK)
	u.SetNamespace("default")
	u.SetName(e.h.label + "-" + name)
	u.Object["spec"] = map[string]any{"numNodes": int64(0), "channel": map[string]any{"resourceClaimTemplate": map[string]any{"name": u.GetName() + "-channel"}}}
	e.h.g.Expect(k8sClient.Create(e.h.ctx, u)).To(Succeed())
	e.h.t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), u) })
	u.Object["status"] = map[string]any{"status": "Ready"}
	e.h.g.Expect(k8sClient.Status().Update(e.h.ctx, u)).To(Succeed())
	e.h.g.Eventually(func() string {
		d, _ := e.view.Domain(u.GetUID())
		return d.Status
	}, 10*time.Second, 20*time.Millisecond).Should(Equal("Ready"), "the view sees the domain")
	e.domains[u.GetUID()] = u
	return u.GetUID()
}

func (e *cdEnv) domainName(uid types.UID) string {
	d, ok := e.view.Domain(uid)
	e.h.g.Expect(ok).To(BeTrue())
	return d.Name
}

// member creates domain "d" and makes node "a", in clique "<label>.1",
// its member, listed by the view.
func (e *cdEnv) member() (types.UID, string, string) {
	e.h.t.Helper()
	d := e.domain("d")
	clique := e.h.label + ".1"
	n := e.h.cliqueNode("a", clique)
	e.join(n, d, clique)
	e.waitListed(n, true)
	return d, clique, n
}

// join makes node a member of the domain as the driver does: node label,
// daemon pod, then the clique entry (v25.12 and later, where the daemon
// also labels its pod with the clique) or the status.nodes entry (v25.8).
func (e *cdEnv) join(node string, uid types.UID, clique string) {
	e.h.t.Helper()
	n := e.h.getNode(node)
	patch := client.MergeFrom(n.DeepCopy())
	n.Labels[computedomain.NodeLabel] = string(uid)
	e.h.g.Expect(k8sClient.Patch(e.h.ctx, n, patch)).To(Succeed())
	labels := map[string]string{computedomain.NodeLabel: string(uid)}
	if e.shape.Cliques {
		labels[computedomain.PodCliqueLabel] = clique
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: daemonPodName(node), Namespace: driverNamespace,
			Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "DaemonSet", Name: "computedomain-daemon-" + string(uid), UID: types.UID("ds-" + string(uid)), Controller: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "imex", Image: "imex"}}},
	}
	e.h.g.Expect(k8sClient.Create(e.h.ctx, pod)).To(Succeed())
	e.h.t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), pod, client.GracePeriodSeconds(0)) })
	// The daemon runs: the kubelet reports its IP and readiness.
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.0.1",
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	e.h.g.Expect(k8sClient.Status().Update(e.h.ctx, pod)).To(Succeed())
	if !e.shape.Cliques {
		e.editStatusNodes(uid, func(nodes []any) []any {
			return append(nodes, map[string]any{"name": node, "cliqueID": clique, "index": int64(len(nodes)), "status": "Ready", "ipAddress": "10.1.0.1"})
		})
		return
	}
	key := string(uid) + "." + clique
	cl, ok := e.cliques[key]
	if !ok {
		cl = &unstructured.Unstructured{Object: map[string]any{"daemons": []any{}}}
		cl.SetGroupVersionKind(computedomain.CliqueGVK)
		cl.SetNamespace(driverNamespace)
		cl.SetName(key)
		e.h.g.Expect(k8sClient.Create(e.h.ctx, cl)).To(Succeed())
		e.h.t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), cl) })
		e.cliques[key] = cl
	}
	daemons := cl.Object["daemons"].([]any)
	cl.Object["daemons"] = append(daemons, map[string]any{"nodeName": node, "cliqueID": clique, "index": int64(len(daemons)), "status": "Ready", "ipAddress": "10.1.0.1"})
	e.h.g.Expect(k8sClient.Update(e.h.ctx, cl)).To(Succeed())
}

func daemonPodName(node string) string { return "imex-" + node }

func (e *cdEnv) daemonPodExists(node string) bool {
	err := k8sClient.Get(e.h.ctx, types.NamespacedName{Namespace: driverNamespace, Name: daemonPodName(node)}, &corev1.Pod{})
	if apierrors.IsNotFound(err) {
		return false
	}
	e.h.g.Expect(err).NotTo(HaveOccurred())
	return true
}

// unlabel plays the driver unpreparing the node's claim.
func (e *cdEnv) unlabel(node string) {
	e.h.t.Helper()
	n := e.h.getNode(node)
	patch := client.MergeFrom(n.DeepCopy())
	delete(n.Labels, computedomain.NodeLabel)
	e.h.g.Expect(k8sClient.Patch(e.h.ctx, n, patch)).To(Succeed())
}

// removeDaemon plays the DaemonSet controller and the driver: the daemon
// pod goes, then the clique entry.
func (e *cdEnv) removeDaemon(node string, uid types.UID, clique string) {
	e.h.t.Helper()
	e.deleteDaemonPod(node)
	e.removeCliqueEntry(node, uid, clique)
}

func (e *cdEnv) deleteDaemonPod(node string) {
	e.h.t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: driverNamespace, Name: daemonPodName(node)}}
	e.h.g.Expect(client.IgnoreNotFound(k8sClient.Delete(e.h.ctx, pod, client.GracePeriodSeconds(0)))).To(Succeed())
}

// editStatusNodes rewrites the domain's status.nodes, as v25.8's daemons do.
func (e *cdEnv) editStatusNodes(uid types.UID, edit func([]any) []any) {
	e.h.t.Helper()
	d := e.domains[uid]
	e.h.g.Expect(k8sClient.Get(e.h.ctx, client.ObjectKeyFromObject(d), d)).To(Succeed())
	st, _ := d.Object["status"].(map[string]any)
	if st == nil {
		st = map[string]any{"status": "Ready"}
	}
	nodes, _ := st["nodes"].([]any)
	st["nodes"] = edit(nodes)
	d.Object["status"] = st
	e.h.g.Expect(k8sClient.Status().Update(e.h.ctx, d)).To(Succeed())
}

// removeCliqueEntry plays the driver dropping the node from the domain's
// list: its clique (v25.12 and later) or status.nodes (v25.8).
func (e *cdEnv) removeCliqueEntry(node string, uid types.UID, clique string) {
	e.h.t.Helper()
	if !e.shape.Cliques {
		e.editStatusNodes(uid, func(nodes []any) []any {
			var kept []any
			for _, n := range nodes {
				if n.(map[string]any)["name"] != node {
					kept = append(kept, n)
				}
			}
			return kept
		})
		return
	}
	cl := e.cliques[string(uid)+"."+clique]
	e.h.g.Expect(k8sClient.Get(e.h.ctx, client.ObjectKeyFromObject(cl), cl)).To(Succeed())
	var kept []any
	for _, d := range cl.Object["daemons"].([]any) {
		if d.(map[string]any)["nodeName"] != node {
			kept = append(kept, d)
		}
	}
	cl.Object["daemons"] = kept
	e.h.g.Expect(k8sClient.Update(e.h.ctx, cl)).To(Succeed())
}

// waitListed polls the view (bounded) until node's clique entry is there or gone.
func (e *cdEnv) waitListed(node string, listed bool) {
	e.h.t.Helper()
	e.h.g.Eventually(func() bool { return len(e.view.Listed(node)) > 0 }, 10*time.Second, 20*time.Millisecond).Should(Equal(listed))
}

func (h *harness) cliqueNode(name, clique string) string {
	h.t.Helper()
	return h.node(name, func(n *corev1.Node) { n.Labels[computedomain.CliqueNodeLabel] = clique }).Name
}

// TestComputeDomainAndCliqueBudgets: two ComputeDomains of four members
// across two cliques; faults arrive on four members at once. Each domain
// and each clique lets one node drain at a time, the waiting nodes name the
// blocking budget, and the domains' owners see it in Events on the domain.
func TestComputeDomainAndCliqueBudgets(t *testing.T) {
	for _, shape := range testenv.DriverShapes() {
		t.Run(shape.Name, func(t *testing.T) {
			h := newHarness(t)
			h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.CircuitBreaker.Enabled = ptr.To(false) // four of eight nodes at once is the point here
				s.Budgets.MaxUnavailable = ptr.To(intstrFromInt(10))
				s.Budgets.MaxUnavailablePerComputeDomain = ptr.To(intstrFromInt(1))
				s.Budgets.MaxUnavailablePerClique = ptr.To(intstrFromInt(1))
				s.Recertification.SoakWindow = dur("1h")
			})
			e := h.withComputeDomains(shape)
			d1, d2 := e.domain("d1"), e.domain("d2")
			c1, c2 := h.label+".1", h.label+".2"
			layout := []struct {
				domain types.UID
				clique string
			}{{d1, c1}, {d1, c1}, {d1, c2}, {d1, c2}, {d2, c1}, {d2, c1}, {d2, c2}, {d2, c2}}
			n := make([]string, len(layout))
			for i, l := range layout {
				n[i] = h.cliqueNode(fmt.Sprint("n", i+1), l.clique)
				e.join(n[i], l.domain, l.clique)
			}
			for i := range n {
				e.waitListed(n[i], true)
			}

			// Healthy members: status.computeDomain shows the membership.
			for i := range n {
				h.reconcile(n[i])
			}
			d1Name := e.domainName(d1)
			h.g.Expect(h.nodeHealth(n[0]).Status.ComputeDomain).To(Equal(&gpuhealthv1alpha1.ComputeDomainMembership{
				UID: string(d1), Namespace: "default", Name: d1Name, CliqueID: c1, Membership: gpuhealthv1alpha1.MembershipMember, DomainStatus: "Ready",
				Traces: e.traces(gpuhealthv1alpha1.TraceCliqueEntry, gpuhealthv1alpha1.TraceDaemonPod, gpuhealthv1alpha1.TraceNodeLabel),
			}))

			// Faults on n1, n2 (d1, c1), n5 (d2, c1) and n7 (d2, c2) at once. All
			// are fenced at once: budgets gate draining, never the cordon.
			for _, i := range []int{0, 1, 4, 6} {
				h.fault(n[i], gpuhealthv1alpha1.CheckXID, "79")
			}
			for _, i := range []int{0, 1, 4, 6} {
				h.reconcile(n[i])
				h.g.Expect(h.getNode(n[i]).Spec.Unschedulable).To(BeTrue(), "fatal faults cordon at once")
			}

			// Quarantined → Draining for n1; it now waits to leave d1.
			h.g.Expect(h.phase(n[0])).To(Equal(draining))
			h.g.Expect(h.nodeHealth(n[0]).Status.ComputeDomain.Membership).To(Equal(gpuhealthv1alpha1.MembershipLeaving))
			h.g.Expect(h.nodeHealth(n[0]).Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonLeavingComputeDomain))

			// n2 waits: d1 already has n1 out (and so has clique c1).
			nh := h.nodeHealth(n[1])
			h.g.Expect(nh.Status.Phase).To(Equal(quarantined))
			h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonWaitingForBudget))
			h.g.Expect(nh.Status.BlockingBudget).To(Equal(gpuhealthv1alpha1.BudgetPerComputeDomain))
			h.g.Expect(nh.Status.Message).To(ContainSubstring(fmt.Sprintf("no room under maxUnavailablePerComputeDomain 1 in ComputeDomain default/%s", d1Name)))
			h.g.Expect(nh.Status.Message).To(ContainSubstring(fmt.Sprintf("no room under maxUnavailablePerClique 1 in clique %s", c1)))

			// n5 waits for clique c1 alone: d2 has nobody out yet.
			nh = h.nodeHealth(n[4])
			h.g.Expect(nh.Status.Phase).To(Equal(quarantined))
			h.g.Expect(nh.Status.BlockingBudget).To(Equal(gpuhealthv1alpha1.BudgetPerClique))
			h.g.Expect(nh.Status.Message).NotTo(ContainSubstring("maxUnavailablePerComputeDomain"))

			// n7 (d2, c2) has room in both.
			h.g.Expect(h.phase(n[6])).To(Equal(draining))

			// The domains' owners see it on the ComputeDomain.
			d2Name := e.domainName(d2)
			h.g.Expect(e.rec.on("ComputeDomain", "default", d1Name)).To(Equal([]string{gpuhealthv1alpha1.ReasonMemberQuarantined, gpuhealthv1alpha1.ReasonMemberQuarantined, gpuhealthv1alpha1.ReasonMemberWaitingForBudget}))
			h.g.Expect(e.rec.on("ComputeDomain", "default", d2Name)).To(Equal([]string{gpuhealthv1alpha1.ReasonMemberQuarantined, gpuhealthv1alpha1.ReasonMemberWaitingForBudget, gpuhealthv1alpha1.ReasonMemberQuarantined}))
			// Waiting on, for the same budget, is not announced again.
			h.reconcile(n[1])
			h.g.Expect(e.rec.on("ComputeDomain", "default", d1Name)).To(HaveLen(3))

			// n1 leaves d1 (the test plays the driver) and goes on to recertify; as
			// Recertifying it still holds d1's and c1's only slot.
			e.unlabel(n[0])
			e.removeDaemon(n[0], d1, c1)
			e.waitListed(n[0], false)
			h.reconcile(n[0])
			nh = h.nodeHealth(n[0])
			h.g.Expect(nh.Status.Phase).To(Equal(recertifying))
			h.g.Expect(nh.Status.ComputeDomain.Membership).To(Equal(gpuhealthv1alpha1.MembershipLeft))
			h.g.Expect(nh.Status.ComputeDomain.LeftAt).NotTo(BeNil())
			h.g.Expect(e.rec.on("ComputeDomain", "default", d1Name)).To(ContainElement(gpuhealthv1alpha1.ReasonMemberLeft))
			h.reconcile(n[1])
			h.g.Expect(h.phase(n[1])).To(Equal(quarantined), "a recertifying member still counts against its domain")

			// n1 passes its soak and returns: its slot frees; n2 drains, n5 still
			// waits, now for both d2 (held by n7) and clique c1 (held by n2).
			h.clock.Step(time.Hour)
			h.reconcile(n[0])
			h.g.Expect(h.phase(n[0])).To(Equal(healthy))
			h.g.Expect(h.nodeHealth(n[0]).Status.ComputeDomain).To(BeNil(), "a node back in service outside any domain has no membership")
			h.reconcile(n[1])
			h.g.Expect(h.phase(n[1])).To(Equal(draining))
			h.g.Expect(h.nodeHealth(n[1]).Status.BlockingBudget).To(BeEmpty())
			h.reconcile(n[4])
			nh = h.nodeHealth(n[4])
			h.g.Expect(nh.Status.BlockingBudget).To(Equal(gpuhealthv1alpha1.BudgetPerComputeDomain))
			h.g.Expect(nh.Status.Message).To(ContainSubstring(fmt.Sprintf("no room under maxUnavailablePerComputeDomain 1 in ComputeDomain default/%s", d2Name)))
			h.g.Expect(nh.Status.Message).To(ContainSubstring(fmt.Sprintf("no room under maxUnavailablePerClique 1 in clique %s", c1)))
			h.g.Expect(e.rec.on("ComputeDomain", "default", d2Name)).To(HaveLen(4), "a different blocking budget is announced")
		})
	}
}

// TestDrainWaitsForTheNodeToLeaveItsComputeDomain: with its pods gone a
// member stays in Draining until the node label, the daemon pod and the
// clique entry are gone; past leaveTimeout it gets ComputeDomainLeaveStuck
// and an Event, and still waits.
func TestDrainWaitsForTheNodeToLeaveItsComputeDomain(t *testing.T) {
	for _, shape := range testenv.DriverShapes() {
		t.Run(shape.Name, func(t *testing.T) {
			h := newHarness(t)
			h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.ComputeDomain.LeaveTimeout = dur("5m")
				s.Recertification.SoakWindow = dur("1h")
			})
			e := h.withComputeDomains(shape)
			d, clique, n := e.member()
			h.pod(n, h.label+"-worker", nil)
			h.fault(n, gpuhealthv1alpha1.CheckXID, "79")

			// Quarantined → Draining; the workload pod is evicted.
			h.reconcile(n)
			h.g.Expect(h.phase(n)).To(Equal(draining))
			h.g.Expect(h.nodeHealth(n).Status.Drain.CompletedAt).To(BeNil())

			// The pod is gone, the membership is not: still Draining.
			h.g.Expect(h.playKubelet(n)).To(Equal(1))
			res := h.reconcile(n)
			nh := h.nodeHealth(n)
			h.g.Expect(nh.Status.Phase).To(Equal(draining))
			h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonLeavingComputeDomain))
			h.g.Expect(nh.Status.Drain.CompletedAt).NotTo(BeNil())
			h.g.Expect(nh.Status.ComputeDomain.Membership).To(Equal(gpuhealthv1alpha1.MembershipLeaving))
			h.g.Expect(res.RequeueAfter).To(Equal(leaveRecheck))
			h.g.Expect(e.daemonPodExists(n)).To(BeTrue(), "the drain never evicts the daemon pod; the driver removes it")

			// The driver unprepares the claim: the label goes, pod and entry remain.
			e.unlabel(n)
			h.reconcile(n)
			nh = h.nodeHealth(n)
			h.g.Expect(nh.Status.Phase).To(Equal(draining))
			h.g.Expect(nh.Status.ComputeDomain.Traces).To(Equal(e.traces(gpuhealthv1alpha1.TraceCliqueEntry, gpuhealthv1alpha1.TraceDaemonPod)))

			// Past leaveTimeout: the condition and a Warning Event, once; still Draining.
			h.clock.Step(5 * time.Minute)
			h.reconcile(n)
			h.reconcile(n)
			nh = h.nodeHealth(n)
			h.g.Expect(nh.Status.Phase).To(Equal(draining))
			h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonComputeDomainLeaveStuck))
			cond := meta.FindStatusCondition(nh.Status.Conditions, gpuhealthv1alpha1.NodeHealthComputeDomainLeaveStuckCondition)
			h.g.Expect(cond).NotTo(BeNil())
			h.g.Expect(cond.Status).To(Equal(metav1.ConditionTrue))
			h.g.Expect(cond.Message).To(ContainSubstring(traceList(e.traces(gpuhealthv1alpha1.TraceCliqueEntry, gpuhealthv1alpha1.TraceDaemonPod))))
			h.g.Expect(e.rec.on("Node", "", n)).To(ContainElement(gpuhealthv1alpha1.ReasonComputeDomainLeaveStuck))
			dName := e.domainName(d)
			h.g.Expect(e.rec.on("ComputeDomain", "default", dName)).To(Equal([]string{gpuhealthv1alpha1.ReasonMemberQuarantined, gpuhealthv1alpha1.ReasonComputeDomainLeaveStuck}), "one stuck Event, not one per reconcile")

			// The daemon pod and the clique entry go: left, drained, recertifying.
			e.removeDaemon(n, d, clique)
			e.waitListed(n, false)
			h.reconcile(n)
			nh = h.nodeHealth(n)
			h.g.Expect(nh.Status.Phase).To(Equal(recertifying))
			h.g.Expect(nh.Status.ComputeDomain.Membership).To(Equal(gpuhealthv1alpha1.MembershipLeft))
			h.g.Expect(nh.Status.ComputeDomain.Name).To(Equal(dName), "the domain is still named while the node is out of service")
			cond = meta.FindStatusCondition(nh.Status.Conditions, gpuhealthv1alpha1.NodeHealthComputeDomainLeaveStuckCondition)
			h.g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
			h.g.Expect(e.rec.on("ComputeDomain", "default", dName)).To(ContainElement(gpuhealthv1alpha1.ReasonMemberLeft))
		})
	}
}

// lookAlikeDaemonPod creates a running pod on node that carries the
// domain's label and a DaemonSet owner without being the driver's daemon:
// in namespace, controlled by a DaemonSet when controller is true.
func (e *cdEnv) lookAlikeDaemonPod(node, namespace, name string, uid types.UID, controller bool) *corev1.Pod {
	e.h.t.Helper()
	if err := k8sClient.Create(e.h.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		e.h.g.Expect(err).NotTo(HaveOccurred())
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: namespace,
			Labels: map[string]string{computedomain.NodeLabel: string(uid)},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "DaemonSet", Name: name, UID: types.UID(name + "-uid"), Controller: ptr.To(controller),
			}},
		},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "imex", Image: "imex"}}},
	}
	e.h.g.Expect(k8sClient.Create(e.h.ctx, pod)).To(Succeed())
	e.h.t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), pod, client.GracePeriodSeconds(0)) })
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.0.99",
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	e.h.g.Expect(k8sClient.Status().Update(e.h.ctx, pod)).To(Succeed())
	return pod
}

// TestALookAlikeDaemonPodHoldsNoNodeInItsDomain: the domain label on a pod
// proves nothing by itself. A tenant's DaemonSet pod labelled with the
// domain (which the drain leaves, as any DaemonSet pod), and a pod in the
// driver's namespace that no DaemonSet controls, neither keep a drained
// node tied to its domain once the driver's own traces are gone, nor are
// they deleted as a dead member's stale daemon pods.
func TestALookAlikeDaemonPodHoldsNoNodeInItsDomain(t *testing.T) {
	for _, shape := range testenv.DriverShapes() {
		t.Run(shape.Name, func(t *testing.T) {
			h := newHarness(t)
			h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Recertification.SoakWindow = dur("1h")
				s.ComputeDomain.DeadMemberGracePeriod = dur("5m")
			})
			e := h.withComputeDomains(shape)
			d, clique, n := e.member()
			tenant := e.lookAlikeDaemonPod(n, "default", h.label+"-tenant-imex", d, true)
			unowned := e.lookAlikeDaemonPod(n, driverNamespace, h.label+"-unowned", d, false)
			h.fault(n, gpuhealthv1alpha1.CheckXID, "79")

			// Quarantined → Draining: nothing to evict, but the driver's
			// traces hold the node.
			h.reconcile(n)
			nh := h.nodeHealth(n)
			h.g.Expect(nh.Status.Phase).To(Equal(draining))
			h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonLeavingComputeDomain))
			h.g.Expect(nh.Status.ComputeDomain.Traces).To(Equal(e.traces(gpuhealthv1alpha1.TraceCliqueEntry, gpuhealthv1alpha1.TraceDaemonPod, gpuhealthv1alpha1.TraceNodeLabel)))

			// The driver lets go: label, daemon pod and list entry go. The
			// look-alikes stay and do not hold the node.
			e.unlabel(n)
			e.removeDaemon(n, d, clique)
			e.waitListed(n, false)
			h.reconcile(n)
			nh = h.nodeHealth(n)
			h.g.Expect(nh.Status.Phase).To(Equal(recertifying), "left its domain: %s", nh.Status.Reason)
			h.g.Expect(nh.Status.ComputeDomain.Membership).To(Equal(gpuhealthv1alpha1.MembershipLeft))
			h.g.Expect(nh.Status.ComputeDomain.Traces).To(BeEmpty())

			// Dead and fenced: the look-alikes are nobody's stale daemon.
			h.setReady(n, corev1.ConditionUnknown, "Test")
			nd := h.getNode(n)
			patch := client.MergeFrom(nd.DeepCopy())
			nd.Spec.Taints = append(nd.Spec.Taints, corev1.Taint{Key: "node.kubernetes.io/out-of-service", Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
			h.g.Expect(k8sClient.Patch(h.ctx, nd, patch)).To(Succeed())
			h.clock.Step(10 * time.Minute)
			h.reconcile(n)
			for _, p := range []*corev1.Pod{tenant, unowned} {
				got := &corev1.Pod{}
				h.g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
				h.g.Expect(got.DeletionTimestamp).To(BeNil(), "%s/%s is not deleted", p.Namespace, p.Name)
			}
			h.g.Expect(e.rec.on("ComputeDomain", "default", e.domainName(d))).NotTo(ContainElement(gpuhealthv1alpha1.ReasonStaleDaemonPodDeleted))
		})
	}
}

// TestAPreviousDomainsPodIsNoTraceOfTheNext: the node now carries domain
// B's label while domain A's daemon pod (terminating) and clique entry are
// still there; neither counts as a trace of B.
func TestAPreviousDomainsPodIsNoTraceOfTheNext(t *testing.T) {
	for _, shape := range testenv.DriverShapes() {
		t.Run(shape.Name, func(t *testing.T) {
			h := newHarness(t)
			h.policy(func(*gpuhealthv1alpha1.RemediationPolicySpec) {})
			e := h.withComputeDomains(shape)
			a, b := e.domain("a"), e.domain("b")
			clique := h.label + ".1"
			n := h.cliqueNode("a", clique)
			e.join(n, a, clique)
			e.waitListed(n, true)
			node := h.getNode(n)
			patch := client.MergeFrom(node.DeepCopy())
			node.Labels[computedomain.NodeLabel] = string(b)
			h.g.Expect(k8sClient.Patch(h.ctx, node, patch)).To(Succeed())
			h.g.Eventually(func() string { return h.getNode(n).Labels[computedomain.NodeLabel] }).Should(Equal(string(b)))

			h.reconcile(n)
			cd := h.nodeHealth(n).Status.ComputeDomain
			h.g.Expect(cd).NotTo(BeNil())
			h.g.Expect(cd.UID).To(Equal(string(b)))
			h.g.Expect(cd.Traces).To(Equal([]gpuhealthv1alpha1.MembershipTrace{gpuhealthv1alpha1.TraceNodeLabel}), "domain A's pod and clique entry are not B's")
		})
	}
}

// TestLeaveStuckClearsWhenReleased: a human releases a node whose leave is
// stuck; the condition does not outlive the drain.
func TestLeaveStuckClearsWhenReleased(t *testing.T) {
	for _, shape := range testenv.DriverShapes() {
		t.Run(shape.Name, func(t *testing.T) {
			h := newHarness(t)
			h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) { s.ComputeDomain.LeaveTimeout = dur("1m") })
			e := h.withComputeDomains(shape)
			_, _, n := e.member()
			h.fault(n, gpuhealthv1alpha1.CheckXID, "79")
			h.reconcile(n)
			h.clock.Step(time.Minute)
			h.reconcile(n)
			stuck := func() metav1.ConditionStatus {
				return meta.FindStatusCondition(h.nodeHealth(n).Status.Conditions, gpuhealthv1alpha1.NodeHealthComputeDomainLeaveStuckCondition).Status
			}
			h.g.Expect(stuck()).To(Equal(metav1.ConditionTrue))

			nh := h.nodeHealth(n)
			patch := client.MergeFrom(nh.DeepCopy())
			nh.Spec.Request = &gpuhealthv1alpha1.ManualRequest{Action: gpuhealthv1alpha1.RequestRelease, ID: "t1", Reason: "domain cleaned up by hand"}
			h.g.Expect(k8sClient.Patch(h.ctx, nh, patch)).To(Succeed())
			h.reconcile(n)
			h.g.Expect(h.phase(n)).To(Equal(healthy))
			h.g.Expect(stuck()).To(Equal(metav1.ConditionFalse))
		})
	}
}

// TestDeadMemberDaemonPodDeletedOnlyAfterFencing: a NotReady member's stale
// daemon pod is deleted only once the node is quarantined, cordoned, marked
// out of service and past the grace period; a Ready node's pod is never
// touched, even when fenced and marked out of service.
func TestDeadMemberDaemonPodDeletedOnlyAfterFencing(t *testing.T) {
	for _, shape := range testenv.DriverShapes() {
		t.Run(shape.Name, func(t *testing.T) {
			h := newHarness(t)
			h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.CircuitBreaker.Enabled = ptr.To(false)
				s.Budgets.MaxUnavailablePerComputeDomain = ptr.To(intstrFromInt(10))
				s.Budgets.MaxUnavailablePerClique = ptr.To(intstrFromInt(10))
				s.ComputeDomain.DeadMemberGracePeriod = dur("5m")
			})
			e := h.withComputeDomains(shape)
			d := e.domain("d")
			clique := h.label + ".1"
			dead, alive := h.cliqueNode("dead", clique), h.cliqueNode("alive", clique)
			for _, n := range []string{dead, alive} {
				e.join(n, d, clique)
				e.waitListed(n, true)
			}
			outOfService := func(node string) {
				nd := h.getNode(node)
				patch := client.MergeFrom(nd.DeepCopy())
				nd.Spec.Taints = append(nd.Spec.Taints, corev1.Taint{Key: "node.kubernetes.io/out-of-service", Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
				h.g.Expect(k8sClient.Patch(h.ctx, nd, patch)).To(Succeed())
			}
			h.setReady(dead, corev1.ConditionUnknown, "Test")
			h.setReady(alive, corev1.ConditionTrue, "Test")

			// NotReady and out of service, but not fenced (no finding): untouched.
			outOfService(dead)
			h.clock.Step(10 * time.Minute)
			h.reconcile(dead)
			h.g.Expect(h.phase(dead)).To(Equal(healthy))
			h.g.Expect(e.daemonPodExists(dead)).To(BeTrue(), "a node gpuhealth has not fenced keeps its pod")

			// Fenced (quarantined, cordoned): now its pod goes.
			h.fault(dead, gpuhealthv1alpha1.CheckGPULost, "GPU_IS_LOST")
			h.reconcile(dead)
			h.g.Expect(h.getNode(dead).Spec.Unschedulable).To(BeTrue())
			h.g.Expect(e.daemonPodExists(dead)).To(BeFalse(), "the dead member's stale daemon pod is deleted")
			h.g.Expect(e.rec.on("ComputeDomain", "default", e.domainName(d))).To(ContainElement(gpuhealthv1alpha1.ReasonStaleDaemonPodDeleted))

			// The Ready node, fenced and even marked out of service: never.
			h.fault(alive, gpuhealthv1alpha1.CheckGPULost, "GPU_IS_LOST")
			outOfService(alive)
			h.reconcile(alive)
			h.clock.Step(time.Hour)
			h.reconcile(alive)
			h.g.Expect(h.getNode(alive).Spec.Unschedulable).To(BeTrue())
			h.g.Expect(e.daemonPodExists(alive)).To(BeTrue(), "a Ready node's pod is never deleted")
		})
	}
}

// TestDeadMemberWaitsForGraceAndOutOfService: fenced and NotReady is not
// enough by default; the out-of-service taint (or notReadyIsDead) and the
// grace period are.
func TestDeadMemberWaitsForGraceAndOutOfService(t *testing.T) {
	for _, shape := range testenv.DriverShapes() {
		t.Run(shape.Name, func(t *testing.T) {
			for _, notReadyIsDead := range []bool{false, true} {
				t.Run(fmt.Sprintf("notReadyIsDead=%v", notReadyIsDead), func(t *testing.T) {
					h := newHarness(t)
					h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
						s.ComputeDomain.DeadMemberGracePeriod = dur("5m")
						s.ComputeDomain.NotReadyIsDead = notReadyIsDead
					})
					e := h.withComputeDomains(shape)
					_, _, n := e.member()
					h.setReady(n, corev1.ConditionFalse, "KubeletDown")
					h.fault(n, gpuhealthv1alpha1.CheckGPULost, "GPU_IS_LOST")

					// Fenced, NotReady, inside the grace period: the pod stays and
					// the node looks again when the grace period ends.
					res := h.reconcile(n)
					h.g.Expect(e.daemonPodExists(n)).To(BeTrue())
					if notReadyIsDead {
						h.g.Expect(res.RequeueAfter).To(BeNumerically("<=", 5*time.Minute))
					}
					h.clock.Step(5 * time.Minute)
					h.reconcile(n)
					h.g.Expect(e.daemonPodExists(n)).To(Equal(!notReadyIsDead), "past the grace period only notReadyIsDead is enough without the taint")
				})
			}
		})
	}
}

// TestIMEXFindingsCountOnlyForMembers: an IMEX domain DOWN about a node
// that is no ComputeDomain member is ignored (and says why); the same
// finding about a member (here host-managed IMEX: only the node label)
// quarantines it.
func TestIMEXFindingsCountOnlyForMembers(t *testing.T) {
	h := newHarness(t)
	h.policy(nil)
	stranger := h.node("stranger", nil).Name
	hostManaged := h.node("member", func(n *corev1.Node) { n.Labels[computedomain.NodeLabel] = "8d5a3c1e-uid" }).Name
	imexDown := func(node string) *gpuhealthv1alpha1.NodeHealthEvent {
		spec := gpuhealthv1alpha1.NodeHealthEventSpec{
			NodeName: node, Source: gpuhealthv1alpha1.SourceIMEX, Check: gpuhealthv1alpha1.CheckIMEXDomain, Code: "DOWN",
			Severity: gpuhealthv1alpha1.SeverityFatal, Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentIMEX, ID: "domain"},
			Message: "IMEX domain DOWN",
		}
		ev := &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: spec.EventName()}, Spec: spec}
		h.g.Expect(k8sClient.Create(h.ctx, ev)).To(Succeed())
		t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), ev) })
		now := metav1.NewTime(h.clock.Now())
		ev.Status = gpuhealthv1alpha1.NodeHealthEventStatus{Count: 1, FirstSeen: &now, LastSeen: &now}
		h.g.Expect(k8sClient.Status().Update(h.ctx, ev)).To(Succeed())
		return ev
	}
	stale, member := imexDown(stranger), imexDown(hostManaged)

	h.reconcile(stranger)
	h.reconcile(hostManaged)
	h.g.Expect(h.phase(stranger)).To(Equal(healthy))
	h.g.Expect(h.getNode(stranger).Spec.Unschedulable).To(BeFalse())
	got := &gpuhealthv1alpha1.NodeHealthEvent{}
	h.g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(stale), got)).To(Succeed())
	h.g.Expect(got.Status.Phase).To(Equal(gpuhealthv1alpha1.EventIgnored))
	h.g.Expect(got.Status.Classification.Verdict).To(Equal(gpuhealthv1alpha1.VerdictIgnore))
	h.g.Expect(got.Status.Classification.Reason).To(ContainSubstring("no ComputeDomain member"))

	h.g.Expect(h.phase(hostManaged)).NotTo(Equal(healthy))
	h.g.Expect(h.getNode(hostManaged).Spec.Unschedulable).To(BeTrue())
	h.g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(member), got)).To(Succeed())
	h.g.Expect(got.Status.Phase).To(Equal(gpuhealthv1alpha1.EventActive))
	nh := h.nodeHealth(hostManaged)
	h.g.Expect(nh.Status.ComputeDomain).NotTo(BeNil())
	h.g.Expect(nh.Status.ComputeDomain.UID).To(Equal("8d5a3c1e-uid"))
	h.g.Expect(nh.Status.ComputeDomain.Traces).To(Equal([]gpuhealthv1alpha1.MembershipTrace{gpuhealthv1alpha1.TraceNodeLabel}))
	h.g.Expect(historyPhases(nh)).To(ContainElement(quarantined))
}

// setReady sets the node's Ready condition, changed now by the test clock.
func (h *harness) setReady(node string, status corev1.ConditionStatus, reason string) {
	h.t.Helper()
	nd := h.getNode(node)
	nd.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, Reason: reason,
		LastHeartbeatTime: metav1.NewTime(h.clock.Now()), LastTransitionTime: metav1.NewTime(h.clock.Now())}}
	h.g.Expect(k8sClient.Status().Update(h.ctx, nd)).To(Succeed())
}

// resyncDriver plays one pass of NVIDIA's driver controller and the
// domain's DaemonSet, by the documented rules of the shape:
//   - the DaemonSet keeps a daemon pod bound to every node that carries the
//     domain label, re-creating a deleted one at once (on a dead node the new
//     pod never runs: no IP, never Ready), and deletes the pods of nodes
//     without the label;
//   - v25.12 and later: the controller keeps a clique entry while a daemon
//     pod object is bound to the node, and drops it once none is;
//   - v25.8: the controller drops a status.nodes entry by the IP of a
//     daemon pod that was deleted.
func (e *cdEnv) resyncDriver(uid types.UID, clique string, nodes ...string) {
	e.h.t.Helper()
	for _, n := range nodes {
		labelled := e.h.getNode(n).Labels[computedomain.NodeLabel] == string(uid)
		bound := e.daemonPods(n, uid)
		switch {
		case labelled && len(bound) == 0:
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{
					GenerateName: daemonPodName(n) + "-", Namespace: driverNamespace,
					Labels: map[string]string{computedomain.NodeLabel: string(uid)},
					OwnerReferences: []metav1.OwnerReference{{
						APIVersion: "apps/v1", Kind: "DaemonSet", Name: "computedomain-daemon-" + string(uid), UID: types.UID("ds-" + string(uid)), Controller: ptr.To(true),
					}},
				},
				Spec: corev1.PodSpec{NodeName: n, Containers: []corev1.Container{{Name: "imex", Image: "imex"}}},
			}
			e.h.g.Expect(k8sClient.Create(e.h.ctx, pod)).To(Succeed())
			e.h.t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), pod, client.GracePeriodSeconds(0)) })
			bound = append(bound, *pod)
		case !labelled:
			for i := range bound {
				e.h.g.Expect(client.IgnoreNotFound(k8sClient.Delete(e.h.ctx, &bound[i], client.GracePeriodSeconds(0)))).To(Succeed())
			}
			bound = nil
		}
		if e.shape.Cliques && len(bound) == 0 {
			e.removeCliqueEntry(n, uid, clique)
		}
	}
}

// daemonPods lists the domain's daemon pods bound to node.
func (e *cdEnv) daemonPods(node string, uid types.UID) []corev1.Pod {
	e.h.t.Helper()
	var pods corev1.PodList
	e.h.g.Expect(k8sClient.List(e.h.ctx, &pods, client.InNamespace(driverNamespace), client.MatchingLabels{computedomain.NodeLabel: string(uid)})).To(Succeed())
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.Spec.NodeName == node && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// TestADeadMemberLeavesTheDriversList: a dead, fenced member under each
// driver shape, with the driver's controller and DaemonSet played by
// resyncDriver. Its daemon pod is deleted once; on v25.8 that drops its
// entry; on v25.12 the DaemonSet re-creates the pod, the clique keeps the
// entry, gpuhealth does not delete again (the new pod never ran) and says
// DeadMemberListed, once on the domain; the policy's releaseDeadMemberLabel
// then removes the label and the entry goes.
func TestADeadMemberLeavesTheDriversList(t *testing.T) {
	for _, shape := range testenv.DriverShapes() {
		t.Run(shape.Name, func(t *testing.T) {
			h := newHarness(t)
			policy := h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.CircuitBreaker.Enabled = ptr.To(false)
				s.ComputeDomain.DeadMemberGracePeriod = dur("5m")
				s.ComputeDomain.NotReadyIsDead = true
			})
			e := h.withComputeDomains(shape)
			d := e.domain("d")
			clique := h.label + ".1"
			dead, alive := h.cliqueNode("dead", clique), h.cliqueNode("alive", clique)
			for _, n := range []string{dead, alive} {
				e.join(n, d, clique)
				e.waitListed(n, true)
			}
			h.setReady(dead, corev1.ConditionUnknown, "NodeStatusUnknown")
			h.fault(dead, gpuhealthv1alpha1.CheckGPULost, "GPU_IS_LOST")
			h.reconcile(dead)
			h.clock.Step(5 * time.Minute)
			h.reconcile(dead)
			h.g.Expect(e.daemonPodExists(dead)).To(BeFalse(), "the dead member's daemon pod is deleted")
			deletions := func() int {
				n := 0
				for _, r := range e.rec.on("ComputeDomain", "default", e.domainName(d)) {
					if r == gpuhealthv1alpha1.ReasonStaleDaemonPodDeleted {
						n++
					}
				}
				return n
			}
			h.g.Expect(deletions()).To(Equal(1))

			// The driver's pass: v25.8 drops the entry by the pod's IP; v25.12's
			// DaemonSet re-creates the pod on the dead node and the clique keeps
			// the entry.
			e.resyncDriver(d, clique, dead, alive)
			if !shape.Cliques {
				e.removeCliqueEntry(dead, d, clique) // by the deleted pod's IP
				e.waitListed(dead, false)
				for range 3 {
					h.reconcile(dead)
				}
				h.g.Expect(meta.IsStatusConditionTrue(h.nodeHealth(dead).Status.Conditions, gpuhealthv1alpha1.NodeHealthDeadMemberListedCondition)).To(BeFalse())
				h.g.Expect(deletions()).To(Equal(1))
				return
			}
			h.g.Expect(e.daemonPods(dead, d)).To(HaveLen(1), "the DaemonSet re-created the pod")
			h.g.Eventually(func() int { return len(e.view.Listed(dead)) }).Should(Equal(1), "the clique keeps the entry while a pod object is bound")
			h.reconcile(dead)
			h.g.Expect(meta.IsStatusConditionTrue(h.nodeHealth(dead).Status.Conditions, gpuhealthv1alpha1.NodeHealthDeadMemberListedCondition)).To(BeFalse(),
				"the driver gets deadMemberSettle to drop the entry")
			h.clock.Step(deadMemberSettle)
			for range 3 {
				h.reconcile(dead)
				e.resyncDriver(d, clique, dead, alive)
			}
			h.g.Expect(deletions()).To(Equal(1), "a pod that never ran is not deleted again: no churn")
			nh := h.nodeHealth(dead)
			cond := meta.FindStatusCondition(nh.Status.Conditions, gpuhealthv1alpha1.NodeHealthDeadMemberListedCondition)
			h.g.Expect(cond).NotTo(BeNil())
			h.g.Expect(cond.Status).To(Equal(metav1.ConditionTrue))
			h.g.Expect(cond.Message).To(ContainSubstring("CliqueEntry"))
			h.g.Expect(e.rec.on("ComputeDomain", "default", e.domainName(d))).To(ContainElement(gpuhealthv1alpha1.ReasonDeadMemberStillListed))
			stillListed := 0
			for _, r := range e.rec.on("ComputeDomain", "default", e.domainName(d)) {
				if r == gpuhealthv1alpha1.ReasonDeadMemberStillListed {
					stillListed++
				}
			}
			h.g.Expect(stillListed).To(Equal(1), "one Event on the domain, not one per reconcile")
			h.g.Expect(h.getNode(dead).Labels).To(HaveKey(computedomain.NodeLabel), "the driver's label is left alone by default")

			// The policy's choice: the label goes, so the DaemonSet removes the
			// pod and the clique drops the entry.
			h.g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(policy), policy)).To(Succeed())
			policy.Spec.ComputeDomain.ReleaseDeadMemberLabel = true
			h.g.Expect(k8sClient.Update(h.ctx, policy)).To(Succeed())
			h.g.Eventually(func() bool {
				h.reconcile(dead)
				return h.getNode(dead).Labels[computedomain.NodeLabel] == ""
			}).Should(BeTrue(), "releaseDeadMemberLabel removes the label")
			h.g.Expect(e.rec.on("Node", "", dead)).To(ContainElement(gpuhealthv1alpha1.ReasonDeadMemberLabelRemoved))
			e.resyncDriver(d, clique, dead, alive)
			e.waitListed(dead, false)
			h.reconcile(dead)
			cond = meta.FindStatusCondition(h.nodeHealth(dead).Status.Conditions, gpuhealthv1alpha1.NodeHealthDeadMemberListedCondition)
			h.g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
			h.g.Expect(e.view.Listed(alive)).NotTo(BeEmpty(), "the live member stays")
		})
	}
}
