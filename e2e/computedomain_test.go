//go:build e2e

package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// driverNamespace is where the DRA driver stand-in runs its daemons and
// keeps its cliques.
const driverNamespace = "nvidia-dra-driver-gpu"

// The driver's CRDs, by name.
const (
	computeDomainCRD = "computedomains.resource.nvidia.com"
	cliqueCRD        = "computedomaincliques.resource.nvidia.com"
)

// testComputeDomains runs the ComputeDomain cases against NVIDIA's DRA
// driver in each API shape gpuhealth supports: v25.8 (ComputeDomain only,
// members in status.nodes) and v25.12 (with ComputeDomainClique). The
// driver is played by framework.DRADriver from the documented rules; the
// cluster's own DaemonSet controller, scheduler, pod garbage collector and
// kwok run what it creates, and the real operator and monitors act. Two
// domains share clique 0: train-a on gpu-node-0 and -1, train-b on
// gpu-node-2 and -3, each node running one pod of its domain's workload.
func testComputeDomains(t *testing.T) {
	t.Cleanup(func() {
		_, _ = env.Cluster.Kubectl(ctx, "delete", "crd", computeDomainCRD, cliqueCRD, "--ignore-not-found")
	})
	for i, shape := range testenv.DriverShapes() {
		// Each shape's faults go to their own GPU, so no finding of the
		// previous run is still around.
		r := &cdRun{shape: shape, device: 5 + i, ns: "cd-" + strings.ReplaceAll(shape.Name, ".", "-")}
		t.Run(shape.Name, r.run)
	}
}

// cdRun is one shape's run.
type cdRun struct {
	t       *testing.T
	shape   testenv.DriverShape
	drv     *framework.DRADriver
	ns      string
	device  int
	domains map[string][]string
	uids    map[string]types.UID
}

func (r *cdRun) run(t *testing.T) {
	g := NewWithT(t)
	shape := r.shape
	members := []string{"gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3"}
	for _, n := range members {
		g.Eventually(phase(n)).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	}
	if !shape.Cliques {
		kubectl(t, "delete", "crd", cliqueCRD, "--ignore-not-found")
	}
	kubectl(t, "apply", "-f", shape.Dir)
	kubectl(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/"+computeDomainCRD)

	r.t = t
	r.drv = &framework.DRADriver{Client: env.Cluster.Client, Namespace: driverNamespace, Cliques: shape.Cliques, Log: t.Logf}
	r.domains = map[string][]string{"train-a": members[:2], "train-b": members[2:]}
	r.uids = map[string]types.UID{}
	g.Expect(r.drv.Start(ctx)).To(Succeed())
	t.Cleanup(r.drv.Stop)
	// Only the ComputeDomain and clique budgets (the sample's 1 and 1)
	// gate here; dead members count after 2 s.
	patchPolicy(t, `{"spec":{"budgets":{"maxUnavailable":5},"computeDomain":{"deadMemberGracePeriod":"2s","releaseDeadMemberLabel":false}}}`)
	t.Cleanup(func() {
		patchPolicy(t, `{"spec":{"budgets":{"maxUnavailable":"10%"},"computeDomain":{"deadMemberGracePeriod":"5m","releaseDeadMemberLabel":false}}}`)
	})
	for _, name := range []string{"train-a", "train-b"} {
		uid, err := framework.CreateComputeDomain(ctx, env.Cluster.Client, r.ns, name)
		g.Expect(err).NotTo(HaveOccurred())
		r.uids[name] = uid
		g.Expect(framework.CreateWorkload(ctx, env.Cluster, framework.Workload{
			Namespace: r.ns, Name: name, Replicas: 2, Allowed: r.domains[name],
			PodLabels: map[string]string{framework.WorkloadDomainLabel: name},
		})).To(Succeed())
	}
	t.Cleanup(r.cleanup)
	r.allJoined(g)

	t.Run("budgets and leaving", r.budgetsAndLeaving)
	t.Run("dead member", r.deadMember)
}

// entry is the trace a member list entry leaves in this shape.
func (r *cdRun) entry() gpuhealthv1alpha1.MembershipTrace {
	if r.shape.Cliques {
		return gpuhealthv1alpha1.TraceCliqueEntry
	}
	return gpuhealthv1alpha1.TraceStatusEntry
}

// allJoined waits until every node is a member its NodeHealth shows, down
// to this shape's list entry and the node's clique.
func (r *cdRun) allJoined(g Gomega) {
	for name, nodes := range r.domains {
		for _, n := range nodes {
			g.Eventually(func(g Gomega) {
				cd := nodeHealth(g, n).Status.ComputeDomain
				g.Expect(cd).NotTo(BeNil())
				g.Expect(cd.UID).To(Equal(string(r.uids[name])))
				g.Expect(cd.Name).To(Equal(name))
				g.Expect(cd.Membership).To(Equal(gpuhealthv1alpha1.MembershipMember))
				g.Expect(cd.Traces).To(ContainElements(gpuhealthv1alpha1.TraceNodeLabel, gpuhealthv1alpha1.TraceDaemonPod, r.entry()))
				g.Expect(cd.CliqueID).To(Equal(node(g, n).Labels[framework.CliqueLabel]))
			}).Should(Succeed(), "%s joins %s", n, name)
		}
	}
}

// listed says whether the driver lists node in its domain.
func (r *cdRun) listed(g Gomega, node string) bool {
	for name, members := range r.domains {
		if slices.Contains(members, node) {
			nodes, err := r.drv.Listed(ctx, r.ns, name)
			g.Expect(err).NotTo(HaveOccurred())
			return slices.Contains(nodes, node)
		}
	}
	return false
}

// domainEvents counts the Events on ComputeDomain name, about node, with
// reason, read back through the apiserver (a series counts its occurrences).
func (r *cdRun) domainEvents(g Gomega, name, node, reason string) int {
	var list eventsv1.EventList
	g.Expect(env.Cluster.Client.List(ctx, &list, client.InNamespace(r.ns))).To(Succeed())
	n := 0
	for _, e := range list.Items {
		if e.Regarding.Kind != "ComputeDomain" || e.Regarding.Name != name || e.Related == nil || e.Related.Name != node || e.Reason != reason {
			continue
		}
		if e.Series != nil {
			n += int(e.Series.Count)
		} else {
			n++
		}
	}
	return n
}

// budgetsAndLeaving: XID 79 on gpu-node-0, -1 (train-a) and -2 (train-b)
// at once. All three are cordoned at once; with one slot per domain and
// per clique they drain and recertify one at a time, the waiting ones
// naming the blocking budget (the clique's for train-b's member, the
// domain's for train-a's second). No node is Recertifying while the driver
// still has a trace of it (label, daemon pod, list entry): a node is
// drained only once it left, and it left when the stand-in, seeing its
// workload pod evicted, unprepared the claim. Every quarantine is an Event
// on the member's ComputeDomain. Back in service, each node rejoins its
// domain when its workload's pending replica lands on it again.
func (r *cdRun) budgetsAndLeaving(t *testing.T) {
	g := NewWithT(t)
	faulted := []string{"gpu-node-0", "gpu-node-1", "gpu-node-2"}
	domainOf := map[string]string{"gpu-node-0": "train-a", "gpu-node-1": "train-a", "gpu-node-2": "train-b"}
	for _, n := range faulted {
		injectXID(t, n, r.device, 79)
	}
	maxOut := 0
	blocking := map[gpuhealthv1alpha1.BudgetName]bool{}
	var violations []string
	observe := func(g Gomega) (cordoned, back int) {
		var nhs gpuhealthv1alpha1.NodeHealthList
		g.Expect(env.Cluster.Client.List(ctx, &nhs)).To(Succeed())
		// Read after the NodeHealths: a trace seen now existed when they
		// were read, since nothing rejoins while cordoned.
		var ns corev1.NodeList
		g.Expect(env.Cluster.Client.List(ctx, &ns)).To(Succeed())
		var pods corev1.PodList
		g.Expect(env.Cluster.Client.List(ctx, &pods, client.InNamespace(driverNamespace), client.HasLabels{framework.DomainNodeLabel})).To(Succeed())
		listed := map[string]bool{}
		for name := range r.domains {
			nodes, err := r.drv.Listed(ctx, r.ns, name)
			g.Expect(err).NotTo(HaveOccurred())
			for _, n := range nodes {
				listed[n] = true
			}
		}
		unschedulable, labelled := map[string]bool{}, map[string]bool{}
		for _, n := range ns.Items {
			unschedulable[n.Name] = n.Spec.Unschedulable
			labelled[n.Name] = n.Labels[framework.DomainNodeLabel] != ""
		}
		out := 0
		for _, nh := range nhs.Items {
			if !slices.Contains(faulted, nh.Name) {
				continue
			}
			if b := nh.Status.BlockingBudget; b != "" {
				blocking[b] = true
			}
			switch p := nh.Status.Phase; {
			case p == gpuhealthv1alpha1.PhaseDraining || p == gpuhealthv1alpha1.PhaseRecertifying:
				out++
			case p == gpuhealthv1alpha1.PhaseHealthy && !unschedulable[nh.Name]:
				back++
			}
			if nh.Status.Phase != gpuhealthv1alpha1.PhaseRecertifying {
				continue
			}
			var traces []string
			if labelled[nh.Name] {
				traces = append(traces, "node label")
			}
			if slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool { return p.Spec.NodeName == nh.Name }) {
				traces = append(traces, "daemon pod")
			}
			if listed[nh.Name] {
				traces = append(traces, "list entry")
			}
			if len(traces) > 0 {
				violations = append(violations, fmt.Sprintf("%s Recertifying while the driver still has its %s", nh.Name, strings.Join(traces, ", ")))
			}
		}
		for _, n := range faulted {
			if unschedulable[n] {
				cordoned++
			}
		}
		maxOut = max(maxOut, out)
		return cordoned, back
	}
	g.Eventually(func(g Gomega) int { c, _ := observe(g); return c }, time.Minute, 100*time.Millisecond).Should(Equal(len(faulted)),
		"all three cordoned at once: fatal faults do not wait for the budgets")
	g.Eventually(func(g Gomega) int { _, b := observe(g); return b }, 6*time.Minute, 100*time.Millisecond).Should(Equal(len(faulted)))

	g.Expect(maxOut).To(Equal(1), "one slot per clique: never more than one of the three draining or recertifying")
	g.Expect(blocking).To(HaveKey(gpuhealthv1alpha1.BudgetPerClique), "a member of the other domain waited for the clique")
	g.Expect(blocking).To(HaveKey(gpuhealthv1alpha1.BudgetPerComputeDomain), "train-a's second member waited for its domain")
	g.Expect(violations).To(BeEmpty(), "drained means left")
	for _, n := range faulted {
		g.Expect(historyPhases(nodeHealth(g, n))).To(ContainElements(gpuhealthv1alpha1.PhaseDraining, gpuhealthv1alpha1.PhaseRecertifying), "%s drained and recertified", n)
	}
	// One Event on the domain per quarantine of a member.
	g.Eventually(func(g Gomega) {
		for _, n := range faulted {
			g.Expect(r.domainEvents(g, domainOf[n], n, gpuhealthv1alpha1.ReasonMemberQuarantined)).To(Equal(1), "%s's quarantine on %s", n, domainOf[n])
			g.Expect(r.domainEvents(g, domainOf[n], n, gpuhealthv1alpha1.ReasonMemberLeft)).To(Equal(1), "%s left %s", n, domainOf[n])
		}
	}).Should(Succeed())
	out := kubectl(t, "get", "events", "-n", r.ns, "--field-selector", "involvedObject.kind=ComputeDomain")
	t.Logf("kubectl get events -n %s (ComputeDomains):\n%s", r.ns, out)
	r.allJoined(g)
}

// deadMember: gpu-node-3 (train-b) dies: kwok stops running it, its Ready
// turns Unknown, its last report is an XID 79, and the admin marks it
// node.kubernetes.io/out-of-service. gpuhealth deletes its daemon pod,
// once. On v25.8 that drops its status.nodes entry. On v25.12 the
// DaemonSet re-creates the pod on the dead node at once, the pod never
// runs, the clique keeps the entry, gpuhealth does not delete again and
// says DeadMemberListed (an Event on the domain); the policy's
// releaseDeadMemberLabel then removes the node's domain label, the
// DaemonSet's pod goes (the pod garbage collector removes it from the
// out-of-service node) and the clique drops the entry. The peer stays
// listed. Revived, the node finishes its cycle and rejoins.
func (r *cdRun) deadMember(t *testing.T) {
	g := NewWithT(t)
	const dead, peer, domain = "gpu-node-3", "gpu-node-2", "train-b"
	outOfService := "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
	g.Expect(env.KillNode(ctx, dead)).To(Succeed())
	revived := false
	revive := func() {
		if revived {
			return
		}
		revived = true
		_, _ = env.Cluster.Kubectl(ctx, "taint", "node", dead, "node.kubernetes.io/out-of-service-")
		g.Expect(env.ReviveNode(ctx, dead)).To(Succeed())
	}
	t.Cleanup(revive)
	ready := func(g Gomega) bool {
		return slices.ContainsFunc(node(g, dead).Status.Conditions, func(c corev1.NodeCondition) bool {
			return c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
		})
	}
	g.Consistently(ready, 3*time.Second).Should(BeFalse(), "kwok no longer runs the node")
	injectXID(t, dead, r.device, 79)
	g.Eventually(func(g Gomega) bool { return quarantined(g, dead) }).Should(BeTrue())
	kubectl(t, "taint", "node", dead, outOfService)

	deleted := func(g Gomega) int {
		return r.domainEvents(g, domain, dead, gpuhealthv1alpha1.ReasonStaleDaemonPodDeleted)
	}
	g.Eventually(deleted).Should(Equal(1), "the dead member's daemon pod is deleted")
	deadListed := func(g Gomega) metav1.ConditionStatus {
		c := meta.FindStatusCondition(nodeHealth(g, dead).Status.Conditions, gpuhealthv1alpha1.NodeHealthDeadMemberListedCondition)
		if c == nil {
			return metav1.ConditionUnknown
		}
		return c.Status
	}
	if !r.shape.Cliques {
		g.Eventually(func(g Gomega) bool { return r.listed(g, dead) }).Should(BeFalse(), "v25.8 drops the entry of the deleted pod's IP")
		g.Consistently(deadListed, 3*time.Second).ShouldNot(Equal(metav1.ConditionTrue))
		g.Consistently(deleted, 3*time.Second).Should(Equal(1), "the re-created pod, which never ran, is left alone")
	} else {
		// The DaemonSet re-creates the pod; the clique keeps the entry. (Had
		// the driver's pass fallen between the deletion and the re-creation,
		// it would have dropped the entry, as NVIDIA's controller can.)
		var state string
		g.Eventually(func(g Gomega) string {
			switch {
			case deadListed(g) == metav1.ConditionTrue:
				state = "listed"
			case !r.listed(g, dead):
				state = "dropped"
			}
			return state
		}).ShouldNot(BeEmpty())
		if state == "dropped" {
			t.Logf("the stand-in dropped %s's entry before the DaemonSet re-created its pod; the release path is not exercised in this run", dead)
		} else {
			g.Consistently(func(g Gomega) bool { return r.listed(g, dead) }, 4*time.Second).Should(BeTrue(),
				"a daemon pod object is bound to the dead node, so the clique keeps it")
			g.Expect(deleted(g)).To(Equal(1), "the re-created pod, which never ran, is not deleted again")
			g.Eventually(func(g Gomega) int {
				return r.domainEvents(g, domain, dead, gpuhealthv1alpha1.ReasonDeadMemberStillListed)
			}).Should(Equal(1))
			g.Expect(node(g, dead).Labels).To(HaveKey(framework.DomainNodeLabel), "the driver's label is left alone by default")

			patchPolicy(t, `{"spec":{"computeDomain":{"releaseDeadMemberLabel":true}}}`)
			g.Eventually(func(g Gomega) map[string]string { return node(g, dead).Labels }).ShouldNot(HaveKey(framework.DomainNodeLabel))
			g.Eventually(func(g Gomega) bool { return r.listed(g, dead) }, 2*time.Minute).Should(BeFalse(),
				"no daemon pod can be bound there any more: the clique drops the entry")
			g.Eventually(deadListed).Should(Equal(metav1.ConditionFalse))
			g.Expect(deleted(g)).To(Equal(1))
		}
	}
	g.Expect(r.listed(g, peer)).To(BeTrue(), "the live member stays")

	revive()
	g.Eventually(phase(dead), 5*time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	g.Eventually(func(g Gomega) bool { return node(g, dead).Spec.Unschedulable }).Should(BeFalse())
	r.allJoined(g)
}

// cleanup deletes the run's namespace (workloads and domains) and the
// nodes' finished Jobs (later cases count theirs), and waits until the
// driver stand-in has taken everything down: no daemon pod, no node label.
func (r *cdRun) cleanup() {
	g := NewWithT(r.t)
	_, _ = env.Cluster.Kubectl(ctx, "delete", "namespace", r.ns, "--wait=false")
	var nodes []string
	for _, ns := range r.domains {
		nodes = append(nodes, ns...)
	}
	_, err := env.Cluster.Kubectl(ctx, "delete", "jobs", "-n", framework.Namespace, "-l", fmt.Sprintf("%s in (%s)", job.NodeLabel, strings.Join(nodes, ",")))
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func(g Gomega) {
		var pods corev1.PodList
		g.Expect(env.Cluster.Client.List(ctx, &pods, client.InNamespace(driverNamespace))).To(Succeed())
		g.Expect(pods.Items).To(BeEmpty())
		var ns corev1.NodeList
		g.Expect(env.Cluster.Client.List(ctx, &ns, client.HasLabels{framework.DomainNodeLabel})).To(Succeed())
		g.Expect(ns.Items).To(BeEmpty())
	}, 3*time.Minute).Should(Succeed(), "the driver takes the domains down")
}
