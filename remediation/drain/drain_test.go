package drain_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/drain"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// epoch is where every test's fake clock starts.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// operatorNamespace is where gpuhealth creates its Jobs, for the tests
// that have none; those that do make a namespace of their own.
const operatorNamespace = "gpuhealth-system"

func TestDrainEvictsPodsAndIsDoneOnceTheKubeletRemovesThem(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node := ns + "-node"
	for _, name := range []string{"a", "b", "c"} {
		newPod(t, ns, name, node)
	}
	d := drain.New(k8sClient, k8sClient, clocktesting.NewFakeClock(epoch), operatorNamespace)

	// First pass: all three evictions accepted; the pods are terminating but still there.
	res, err := d.Drain(t.Context(), node, gpuhealthv1alpha1.DrainSpec{}, epoch)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(drain.Result{Total: 3, Remaining: 3, Evicted: 3}))
	g.Expect(res.Done()).To(BeFalse())
	for _, name := range []string{"a", "b", "c"} {
		g.Expect(getPod(t, ns, name).DeletionTimestamp).NotTo(BeNil())
	}

	// A pass while they terminate counts them and evicts nothing again.
	res, err = d.Drain(t.Context(), node, gpuhealthv1alpha1.DrainSpec{}, epoch)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(drain.Result{Total: 3, Remaining: 3}))

	playKubelet(t, node)
	res, err = d.Drain(t.Context(), node, gpuhealthv1alpha1.DrainSpec{}, epoch)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(drain.Result{}))
	g.Expect(res.Done()).To(BeTrue())
}

func TestDrainReportsAPodBlockedByAPodDisruptionBudgetUntilTheBudgetAllowsIt(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node := ns + "-node"
	newPod(t, ns, "web-0", node, withLabels(map[string]string{"app": "web"}), running())
	pdb := newPDB(t, ns, "web", map[string]string{"app": "web"})
	setDisruptionsAllowed(t, pdb, 0)
	d := drain.New(k8sClient, k8sClient, clocktesting.NewFakeClock(epoch), operatorNamespace)

	res, err := d.Drain(t.Context(), node, gpuhealthv1alpha1.DrainSpec{}, epoch)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Total).To(Equal(1))
	g.Expect(res.Remaining).To(Equal(1))
	g.Expect(res.Evicted).To(Equal(0))
	g.Expect(res.Blocked).To(Equal(1))
	g.Expect(res.BlockedPods).To(HaveLen(1))
	g.Expect(res.BlockedPods[0].Namespace).To(Equal(ns))
	g.Expect(res.BlockedPods[0].Name).To(Equal("web-0"))
	g.Expect(res.BlockedPods[0].PodDisruptionBudget).To(Equal("web"))
	g.Expect(res.BlockedPods[0].Message).To(ContainSubstring("disruption budget"))
	g.Expect(getPod(t, ns, "web-0").DeletionTimestamp).To(BeNil())

	// The disruption controller sees a healthy replacement and allows one disruption.
	setDisruptionsAllowed(t, pdb, 1)
	res, err = d.Drain(t.Context(), node, gpuhealthv1alpha1.DrainSpec{}, epoch)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(drain.Result{Total: 1, Remaining: 1, Evicted: 1}))
	g.Expect(getPod(t, ns, "web-0").DeletionTimestamp).NotTo(BeNil())
}

func TestDrainSendsNoEvictionTheBudgetAlreadyRefuses(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node := ns + "-node"
	for _, name := range []string{"web-0", "web-1", "web-2"} {
		newPod(t, ns, name, node, withLabels(map[string]string{"app": "web"}), running())
	}
	pdb := newPDB(t, ns, "web", map[string]string{"app": "web"})
	setDisruptionsAllowed(t, pdb, 1)
	d := drain.New(k8sClient, k8sClient, clocktesting.NewFakeClock(epoch), operatorNamespace)

	// The budget allows one disruption: one eviction is sent, the other two
	// are refused here without a request (which would only be answered 429
	// and spend an eviction token).
	res, err := d.Drain(t.Context(), node, gpuhealthv1alpha1.DrainSpec{}, epoch)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Evicted).To(Equal(1))
	g.Expect(res.Blocked).To(Equal(2))
	g.Expect(res.Deferred).To(Equal(0))
	g.Expect(res.BlockedPods).To(HaveLen(2))
	for _, b := range res.BlockedPods {
		g.Expect(b.PodDisruptionBudget).To(Equal("web"))
		g.Expect(b.Message).To(And(ContainSubstring("disruption budget"), ContainSubstring("allows 1 disruptions"), ContainSubstring("not sent")))
	}
	terminating := 0
	for _, name := range []string{"web-0", "web-1", "web-2"} {
		if getPod(t, ns, name).DeletionTimestamp != nil {
			terminating++
		}
	}
	g.Expect(terminating).To(Equal(1))
}

func TestDrainLeavesDaemonSetMirrorOwnJobAndSkippedNamespacePodsAloneAndUncounted(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	skipped := newNamespace(t, nil)
	own := newNamespace(t, nil)
	node := ns + "-node"
	newPod(t, ns, "ds", node, withOwner("apps/v1", "DaemonSet", "gpu-monitor"))
	newPod(t, ns, "mirror", node, withAnnotations(map[string]string{corev1.MirrorPodAnnotationKey: "abc"}))
	newPod(t, skipped, "system", node)
	newPod(t, own, "recert", node, withOwner("batch/v1", "Job", "gpuhealth-recert-x-1"), withLabels(map[string]string{job.KindLabel: string(job.Recertification)}))
	newPod(t, ns, "job", node, withOwner("batch/v1", "Job", "train"))
	spec := gpuhealthv1alpha1.DrainSpec{SkipNamespaces: []string{skipped}}
	d := drain.New(k8sClient, k8sClient, clocktesting.NewFakeClock(epoch), own)

	res, err := d.Drain(t.Context(), node, spec, epoch)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(drain.Result{Total: 1, Remaining: 1, Evicted: 1}))
	g.Expect(getPod(t, ns, "ds").DeletionTimestamp).To(BeNil())
	g.Expect(getPod(t, ns, "mirror").DeletionTimestamp).To(BeNil())
	g.Expect(getPod(t, skipped, "system").DeletionTimestamp).To(BeNil())
	g.Expect(getPod(t, own, "recert").DeletionTimestamp).To(BeNil(), "gpuhealth's own Job pods stay")
	g.Expect(getPod(t, ns, "job").DeletionTimestamp).NotTo(BeNil())

	// With the one pod that had to leave gone, the node is drained although the others stay.
	playKubelet(t, node)
	res, err = d.Drain(t.Context(), node, spec, epoch)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Done()).To(BeTrue())
	g.Expect(res.Total).To(Equal(0))
}

// TestDrainTakesOnlyPodsOfJobsInTheOperatorsNamespaceForItsOwn: the Job
// kind label proves nothing by itself, since anyone may put it on a pod of
// their own; only a pod in the operator's namespace, controlled by a Job,
// is one of gpuhealth's Job pods. Every look-alike is evicted and keeps a
// node from counting as empty.
func TestDrainTakesOnlyPodsOfJobsInTheOperatorsNamespaceForItsOwn(t *testing.T) {
	g := NewWithT(t)
	tenant := newNamespace(t, nil)
	own := newNamespace(t, nil)
	node := tenant + "-node"
	label := withLabels(map[string]string{job.KindLabel: string(job.Recertification)})
	newPod(t, own, "recert", node, withOwner("batch/v1", "Job", "gpuhealth-recert-x-1"), label)
	d := drain.New(k8sClient, k8sClient, clocktesting.NewFakeClock(epoch), own)

	// With only gpuhealth's own Job pod on it, the node counts as empty.
	g.Expect(d.Workloads(t.Context(), node, gpuhealthv1alpha1.DrainSpec{})).To(BeEmpty())

	newPod(t, tenant, "tenant-job", node, withOwner("batch/v1", "Job", "gpuhealth-recert-x-1"), label)
	newPod(t, tenant, "tenant-bare", node, label)
	newPod(t, own, "no-owner", node, label)
	newPod(t, own, "replicaset", node, withOwner("apps/v1", "ReplicaSet", "web-5d8f"), label)
	newPod(t, own, "other-job-kind", node, withOwner("example.com/v1", "Job", "lookalike"), label)
	newPod(t, own, "unlabelled", node, withOwner("batch/v1", "Job", "someone-elses"))
	lookAlikes := []string{
		own + "/no-owner", own + "/other-job-kind", own + "/replicaset", own + "/unlabelled",
		tenant + "/tenant-bare", tenant + "/tenant-job",
	}
	slices.Sort(lookAlikes)

	g.Expect(d.Workloads(t.Context(), node, gpuhealthv1alpha1.DrainSpec{})).To(Equal(lookAlikes),
		"the look-alikes keep the node from counting as empty")
	res, err := d.Drain(t.Context(), node, gpuhealthv1alpha1.DrainSpec{}, epoch)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(drain.Result{Total: 6, Remaining: 6, Evicted: 6}))
	for _, p := range lookAlikes {
		ns, name, _ := strings.Cut(p, "/")
		g.Expect(getPod(t, ns, name).DeletionTimestamp).NotTo(BeNil(), "%s is evicted", p)
	}
	g.Expect(getPod(t, own, "recert").DeletionTimestamp).To(BeNil(), "gpuhealth's own Job pod stays")
}

// TestDrainTakesNoPodForItsOwnWithoutANamespace: a Drainer that was given
// no Job namespace leaves no pod alone for its labels.
func TestDrainTakesNoPodForItsOwnWithoutANamespace(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node := ns + "-node"
	newPod(t, ns, "recert", node, withOwner("batch/v1", "Job", "gpuhealth-recert-x-1"), withLabels(map[string]string{job.KindLabel: string(job.Recertification)}))
	d := drain.New(k8sClient, k8sClient, clocktesting.NewFakeClock(epoch), "")

	g.Expect(d.Workloads(t.Context(), node, gpuhealthv1alpha1.DrainSpec{})).To(Equal([]string{ns + "/recert"}))
}

func TestDrainWaitsForPodsInAWaitForCompletionNamespaceToFinish(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node := ns + "-node"
	newPod(t, ns, "train", node, running())
	spec := gpuhealthv1alpha1.DrainSpec{Namespaces: []gpuhealthv1alpha1.NamespaceDrain{
		{Namespace: ns, Mode: gpuhealthv1alpha1.DrainWaitForCompletion},
	}}
	d := drain.New(k8sClient, k8sClient, clocktesting.NewFakeClock(epoch), operatorNamespace)

	res, err := d.Drain(t.Context(), node, spec, epoch)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(drain.Result{Total: 1, Remaining: 1, Waiting: 1}))
	g.Expect(res.Done()).To(BeFalse())
	g.Expect(getPod(t, ns, "train").DeletionTimestamp).To(BeNil())

	// The training run ends by itself.
	setPhase(t, ns, "train", corev1.PodSucceeded)
	res, err = d.Drain(t.Context(), node, spec, epoch)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(drain.Result{}))
	g.Expect(res.Done()).To(BeTrue())
	g.Expect(getPod(t, ns, "train").DeletionTimestamp).To(BeNil())
}

func TestDrainDeletesABlockedPodOnceItsDeleteAfterTimeoutExpires(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node := ns + "-node"
	newPod(t, ns, "db-0", node, withLabels(map[string]string{"app": "db"}), running())
	setDisruptionsAllowed(t, newPDB(t, ns, "db", map[string]string{"app": "db"}), 0)
	spec := gpuhealthv1alpha1.DrainSpec{Namespaces: []gpuhealthv1alpha1.NamespaceDrain{
		{Namespace: ns, Mode: gpuhealthv1alpha1.DrainDeleteAfterTimeout, Timeout: ptr.To(gpuhealthv1alpha1.Duration("10m"))},
	}}
	clk := clocktesting.NewFakeClock(epoch)
	d := drain.New(k8sClient, k8sClient, clk, operatorNamespace)
	startedAt := clk.Now()

	// Before the timeout the pod is evicted like any other, and the budget refuses.
	res, err := d.Drain(t.Context(), node, spec, startedAt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Blocked).To(Equal(1))
	g.Expect(res.ForceDeleted).To(BeEmpty())
	g.Expect(res.BlockedPods).To(HaveLen(1))
	g.Expect(res.BlockedPods[0].PodDisruptionBudget).To(Equal("db"))

	clk.Step(10*time.Minute - time.Second)
	res, err = d.Drain(t.Context(), node, spec, startedAt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Blocked).To(Equal(1))
	g.Expect(res.ForceDeleted).To(BeEmpty())

	// At the timeout the pod is deleted despite the budget.
	clk.Step(time.Second)
	res, err = d.Drain(t.Context(), node, spec, startedAt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(drain.Result{
		Total:        1,
		Remaining:    1,
		ForceDeleted: []types.NamespacedName{{Namespace: ns, Name: "db-0"}},
	}))
	g.Expect(getPod(t, ns, "db-0").DeletionTimestamp).NotTo(BeNil())

	playKubelet(t, node)
	res, err = d.Drain(t.Context(), node, spec, startedAt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Done()).To(BeTrue())
}

func TestDrainReportsAPodBlockedPastTheDrainTimeoutAndLeavesItWithOnTimeoutWait(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node := ns + "-node"
	newPod(t, ns, "web-0", node, withLabels(map[string]string{"app": "web"}), running())
	pdb := newPDB(t, ns, "web", map[string]string{"app": "web"})
	setDisruptionsAllowed(t, pdb, 0)
	spec := gpuhealthv1alpha1.DrainSpec{Timeout: ptr.To(gpuhealthv1alpha1.Duration("10m")), OnTimeout: gpuhealthv1alpha1.DrainTimeoutWait}
	clk := clocktesting.NewFakeClock(epoch)
	d := drain.New(k8sClient, k8sClient, clk, operatorNamespace)
	startedAt := clk.Now()

	// Just before the timeout the pod is only blocked.
	clk.Step(10*time.Minute - time.Second)
	res, err := d.Drain(t.Context(), node, spec, startedAt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Blocked).To(Equal(1))
	g.Expect(res.TimedOut).To(Equal(0))
	g.Expect(res.TimedOutPods).To(BeNil())
	g.Expect(res.TimedOutMessage()).To(BeEmpty())

	// At the timeout it is reported as timed out, and still left alone.
	clk.Step(time.Second)
	res, err = d.Drain(t.Context(), node, spec, startedAt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Total).To(Equal(1))
	g.Expect(res.Remaining).To(Equal(1))
	g.Expect(res.Blocked).To(Equal(1))
	g.Expect(res.ForceDeleted).To(BeEmpty())
	g.Expect(res.TimedOut).To(Equal(1))
	g.Expect(res.TimedOutPods).To(Equal([]gpuhealthv1alpha1.BlockedPod{{
		Namespace:           ns,
		Name:                "web-0",
		PodDisruptionBudget: "web",
		Message:             "blocked by PodDisruptionBudget web past the 10m0s drain timeout",
	}}))
	g.Expect(res.TimedOutMessage()).To(Equal("1 pod still on the node past the drain timeout: " +
		ns + "/web-0 blocked by PodDisruptionBudget web past the 10m0s drain timeout"))
	g.Expect(getPod(t, ns, "web-0").DeletionTimestamp).To(BeNil())

	// The eviction is still retried: once the budget allows it the pod leaves,
	// and a terminating pod is not timed out.
	setDisruptionsAllowed(t, pdb, 1)
	res, err = d.Drain(t.Context(), node, spec, startedAt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(drain.Result{Total: 1, Remaining: 1, Evicted: 1}))
	res, err = d.Drain(t.Context(), node, spec, startedAt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(drain.Result{Total: 1, Remaining: 1}))
}

func TestDrainDeletesAPodBlockedPastTheDrainTimeoutWithOnTimeoutDelete(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node := ns + "-node"
	newPod(t, ns, "web-0", node, withLabels(map[string]string{"app": "web"}), running())
	setDisruptionsAllowed(t, newPDB(t, ns, "web", map[string]string{"app": "web"}), 0)
	spec := gpuhealthv1alpha1.DrainSpec{Timeout: ptr.To(gpuhealthv1alpha1.Duration("10m")), OnTimeout: gpuhealthv1alpha1.DrainTimeoutDelete}
	clk := clocktesting.NewFakeClock(epoch)
	d := drain.New(k8sClient, k8sClient, clk, operatorNamespace)
	startedAt := clk.Now()

	clk.Step(10*time.Minute - time.Second)
	res, err := d.Drain(t.Context(), node, spec, startedAt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Blocked).To(Equal(1))
	g.Expect(res.ForceDeleted).To(BeEmpty())
	g.Expect(getPod(t, ns, "web-0").DeletionTimestamp).To(BeNil())

	// At the timeout the pod is deleted despite the budget, as DeleteAfterTimeout does.
	clk.Step(time.Second)
	res, err = d.Drain(t.Context(), node, spec, startedAt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(drain.Result{
		Total:        1,
		Remaining:    1,
		ForceDeleted: []types.NamespacedName{{Namespace: ns, Name: "web-0"}},
	}))
	g.Expect(getPod(t, ns, "web-0").DeletionTimestamp).NotTo(BeNil())

	// Terminating, it is neither deleted again nor timed out.
	res, err = d.Drain(t.Context(), node, spec, startedAt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(drain.Result{Total: 1, Remaining: 1}))

	playKubelet(t, node)
	res, err = d.Drain(t.Context(), node, spec, startedAt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Done()).To(BeTrue())
}

func TestDrainTimesOutAWaitForCompletionPodAtItsNamespaceTimeout(t *testing.T) {
	for _, action := range []gpuhealthv1alpha1.DrainTimeoutAction{gpuhealthv1alpha1.DrainTimeoutWait, gpuhealthv1alpha1.DrainTimeoutDelete} {
		t.Run(string(action), func(t *testing.T) {
			g := NewWithT(t)
			ns := newNamespace(t, nil)
			node := ns + "-node"
			newPod(t, ns, "train", node, running())
			spec := gpuhealthv1alpha1.DrainSpec{
				OnTimeout: action,
				Namespaces: []gpuhealthv1alpha1.NamespaceDrain{
					{Namespace: ns, Mode: gpuhealthv1alpha1.DrainWaitForCompletion, Timeout: ptr.To(gpuhealthv1alpha1.Duration("30m"))},
				},
			}
			clk := clocktesting.NewFakeClock(epoch)
			d := drain.New(k8sClient, k8sClient, clk, operatorNamespace)
			startedAt := clk.Now()

			// Before the timeout the pod is waited for, and nothing has timed out.
			clk.Step(30*time.Minute - time.Second)
			res, err := d.Drain(t.Context(), node, spec, startedAt)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(res).To(Equal(drain.Result{Total: 1, Remaining: 1, Waiting: 1}))
			g.Expect(getPod(t, ns, "train").DeletionTimestamp).To(BeNil())

			clk.Step(time.Second)
			res, err = d.Drain(t.Context(), node, spec, startedAt)
			g.Expect(err).NotTo(HaveOccurred())
			switch action {
			case gpuhealthv1alpha1.DrainTimeoutWait:
				g.Expect(res).To(Equal(drain.Result{
					Total:     1,
					Remaining: 1,
					Waiting:   1,
					TimedOut:  1,
					TimedOutPods: []gpuhealthv1alpha1.BlockedPod{{
						Namespace: ns,
						Name:      "train",
						Message:   "still running past the 30m0s drain timeout (WaitForCompletion)",
					}},
				}))
				g.Expect(getPod(t, ns, "train").DeletionTimestamp).To(BeNil())
			case gpuhealthv1alpha1.DrainTimeoutDelete:
				g.Expect(res).To(Equal(drain.Result{
					Total:        1,
					Remaining:    1,
					ForceDeleted: []types.NamespacedName{{Namespace: ns, Name: "train"}},
				}))
				g.Expect(getPod(t, ns, "train").DeletionTimestamp).NotTo(BeNil())
			}
		})
	}
}

func TestDrainTimesOutEachNamespaceAtItsOwnTimeoutOverridingTheDrainTimeout(t *testing.T) {
	g := NewWithT(t)
	short := newNamespace(t, nil)
	plain := newNamespace(t, nil)
	long := newNamespace(t, nil)
	node := plain + "-node"
	for _, ns := range []string{short, plain, long} {
		newPod(t, ns, "web-0", node, withLabels(map[string]string{"app": "web"}), running())
		setDisruptionsAllowed(t, newPDB(t, ns, "web", map[string]string{"app": "web"}), 0)
	}
	spec := gpuhealthv1alpha1.DrainSpec{
		Timeout:   ptr.To(gpuhealthv1alpha1.Duration("2h")),
		OnTimeout: gpuhealthv1alpha1.DrainTimeoutDelete,
		Namespaces: []gpuhealthv1alpha1.NamespaceDrain{
			{Namespace: short, Mode: gpuhealthv1alpha1.DrainEvict, Timeout: ptr.To(gpuhealthv1alpha1.Duration("5m"))},
			{Namespace: long, Mode: gpuhealthv1alpha1.DrainEvict, Timeout: ptr.To(gpuhealthv1alpha1.Duration("3h"))},
		},
	}
	clk := clocktesting.NewFakeClock(epoch)
	d := drain.New(k8sClient, k8sClient, clk, operatorNamespace)
	startedAt := clk.Now()

	// The shorter namespace timeout goes first.
	clk.Step(5 * time.Minute)
	res, err := d.Drain(t.Context(), node, spec, startedAt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.ForceDeleted).To(Equal([]types.NamespacedName{{Namespace: short, Name: "web-0"}}))
	g.Expect(res.Blocked).To(Equal(2))
	g.Expect(getPod(t, plain, "web-0").DeletionTimestamp).To(BeNil())
	g.Expect(getPod(t, long, "web-0").DeletionTimestamp).To(BeNil())

	// The drain timeout applies where no entry sets one; a longer entry outlasts it.
	clk.Step(2*time.Hour - 5*time.Minute)
	res, err = d.Drain(t.Context(), node, spec, startedAt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.ForceDeleted).To(Equal([]types.NamespacedName{{Namespace: plain, Name: "web-0"}}))
	g.Expect(res.Blocked).To(Equal(1))
	g.Expect(getPod(t, long, "web-0").DeletionTimestamp).To(BeNil())

	clk.Step(time.Hour)
	res, err = d.Drain(t.Context(), node, spec, startedAt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.ForceDeleted).To(Equal([]types.NamespacedName{{Namespace: long, Name: "web-0"}}))
	g.Expect(res.Blocked).To(Equal(0))
}

func TestDrainListsTenTimedOutPodsSortedAndCountsTheRest(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node := ns + "-node"
	// Created out of order, so the sort is what puts them in order.
	names := []string{"p11", "p05", "p00", "p08", "p03", "p10", "p01", "p09", "p02", "p07", "p04", "p06"}
	for _, name := range names {
		newPod(t, ns, name, node, running())
	}
	spec := gpuhealthv1alpha1.DrainSpec{DefaultMode: gpuhealthv1alpha1.DrainWaitForCompletion}
	clk := clocktesting.NewFakeClock(epoch)
	d := drain.New(k8sClient, k8sClient, clk, operatorNamespace)
	startedAt := clk.Now()

	// The default drain timeout is an hour.
	clk.Step(time.Hour)
	res, err := d.Drain(t.Context(), node, spec, startedAt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.TimedOut).To(Equal(12))
	g.Expect(res.Waiting).To(Equal(12))
	g.Expect(res.TimedOutPods).To(HaveLen(10))
	for i, p := range res.TimedOutPods {
		g.Expect(p.Name).To(Equal(fmt.Sprintf("p%02d", i)))
		g.Expect(p.Message).To(Equal("still running past the 1h0m0s drain timeout (WaitForCompletion)"))
	}
	g.Expect(res.TimedOutMessage()).To(HavePrefix("12 pods still on the node past the drain timeout: " + ns + "/p00 still running"))
	g.Expect(res.TimedOutMessage()).To(HaveSuffix(ns + "/p09 still running past the 1h0m0s drain timeout (WaitForCompletion); and 2 more"))
}

func TestDrainChoosesTheModeByNamespaceLabels(t *testing.T) {
	g := NewWithT(t)
	labelled := newNamespace(t, map[string]string{"gpuhealth.dev/drain": "wait"})
	plain := newNamespace(t, nil)
	named := newNamespace(t, map[string]string{"gpuhealth.dev/drain": "wait"})
	node := plain + "-node"
	newPod(t, labelled, "train", node)
	newPod(t, plain, "web", node)
	newPod(t, named, "batch", node)
	spec := gpuhealthv1alpha1.DrainSpec{Namespaces: []gpuhealthv1alpha1.NamespaceDrain{
		// First match wins: the entry by name shadows the selector for this namespace.
		{Namespace: named, Mode: gpuhealthv1alpha1.DrainEvict},
		{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"gpuhealth.dev/drain": "wait"}},
			Mode:              gpuhealthv1alpha1.DrainWaitForCompletion,
		},
	}}
	d := drain.New(k8sClient, k8sClient, clocktesting.NewFakeClock(epoch), operatorNamespace)

	res, err := d.Drain(t.Context(), node, spec, epoch)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(drain.Result{Total: 3, Remaining: 3, Evicted: 2, Waiting: 1}))
	g.Expect(getPod(t, labelled, "train").DeletionTimestamp).To(BeNil())
	g.Expect(getPod(t, plain, "web").DeletionTimestamp).NotTo(BeNil())
	g.Expect(getPod(t, named, "batch").DeletionTimestamp).NotTo(BeNil())
}

func TestDrainSpreadsEvictionsOverPassesAtTheConfiguredRate(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node := ns + "-node"
	names := []string{"p0", "p1", "p2", "p3", "p4"}
	for _, name := range names {
		newPod(t, ns, name, node)
	}
	spec := gpuhealthv1alpha1.DrainSpec{EvictionsPerSecond: 1}
	d := drain.New(k8sClient, k8sClient, clocktesting.NewFakeClock(epoch), operatorNamespace)

	// One token a second: a pass gets the token in the bucket and perhaps the
	// next one, never all five.
	res, err := d.Drain(t.Context(), node, spec, epoch)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Total).To(Equal(5))
	g.Expect(res.Remaining).To(Equal(5))
	g.Expect(res.Evicted).To(BeNumerically(">=", 1))
	g.Expect(res.Evicted).To(BeNumerically("<", 5))
	// The rest had no token in time: deferred, to be retried at once.
	g.Expect(res.Deferred).To(Equal(5 - res.Evicted))
	evicted := res.Evicted

	// Later passes carry on with the pods still running, never evicting one twice.
	g.Eventually(func(g Gomega) {
		res, err := d.Drain(t.Context(), node, spec, epoch)
		g.Expect(err).NotTo(HaveOccurred())
		evicted += res.Evicted
		g.Expect(evicted).To(Equal(len(names)))
	}).WithTimeout(30 * time.Second).WithPolling(10 * time.Millisecond).Should(Succeed())
	g.Expect(evicted).To(Equal(len(names)))

	playKubelet(t, node)
	res, err = d.Drain(t.Context(), node, spec, epoch)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Done()).To(BeTrue())
}

// podOption changes a pod before it is created; running() acts after.
type podOption func(*corev1.Pod)

func withLabels(labels map[string]string) podOption {
	return func(p *corev1.Pod) { p.Labels = labels }
}

func withAnnotations(annotations map[string]string) podOption {
	return func(p *corev1.Pod) { p.Annotations = annotations }
}

func withOwner(apiVersion, kind, name string) podOption {
	return func(p *corev1.Pod) {
		p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{
			APIVersion: apiVersion,
			Kind:       kind,
			Name:       name,
			UID:        types.UID(name + "-uid"),
			Controller: ptr.To(true),
		})
	}
}

// running marks the pod Running and Ready after creation, as the kubelet
// would. The Eviction API checks PodDisruptionBudgets only for running pods:
// it deletes Pending ones straight away.
func running() podOption {
	return func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	}
}

// newNamespace creates a namespace with a unique name and deletes it when the
// test ends. envtest runs no namespace controller, so its pods stay behind;
// every test uses its own node name, so they do not meet another test's pass.
func newNamespace(t *testing.T, labels map[string]string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "drain-", Labels: labels}}
	NewWithT(t).Expect(k8sClient.Create(t.Context(), ns)).To(Succeed())
	t.Cleanup(func() {
		if err := k8sClient.Delete(context.Background(), ns); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting namespace %s: %v", ns.Name, err)
		}
	})
	return ns.Name
}

// newPod creates a pod bound to node; options that set status are written
// through the status subresource afterwards.
func newPod(t *testing.T, ns, name, node string, opts ...podOption) {
	t.Helper()
	g := NewWithT(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	for _, opt := range opts {
		opt(pod)
	}
	status := pod.Status
	g.Expect(k8sClient.Create(t.Context(), pod)).To(Succeed())
	if status.Phase != "" {
		pod.Status = status
		g.Expect(k8sClient.Status().Update(t.Context(), pod)).To(Succeed())
	}
}

func getPod(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{}
	NewWithT(t).Expect(k8sClient.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, pod)).To(Succeed())
	return pod
}

// setPhase writes the pod's phase as the kubelet would when its containers exit.
func setPhase(t *testing.T, ns, name string, phase corev1.PodPhase) {
	t.Helper()
	NewWithT(t).Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod := getPod(t, ns, name)
		pod.Status.Phase = phase
		return k8sClient.Status().Update(t.Context(), pod)
	})).To(Succeed())
}

// playKubelet does what the kubelet does once a terminating pod's containers
// have stopped: it removes the pod for good.
func playKubelet(t *testing.T, node string) {
	t.Helper()
	g := NewWithT(t)
	pods := &corev1.PodList{}
	g.Expect(k8sClient.List(t.Context(), pods, client.MatchingFields{drain.NodeNameField: node})).To(Succeed())
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			continue
		}
		err := k8sClient.Delete(t.Context(), &pods.Items[i], client.GracePeriodSeconds(0))
		g.Expect(client.IgnoreNotFound(err)).To(Succeed())
	}
}

// newPDB creates a PodDisruptionBudget that keeps at least one pod matching selector.
func newPDB(t *testing.T, ns, name string, selector map[string]string) *policyv1.PodDisruptionBudget {
	t.Helper()
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: selector},
		},
	}
	NewWithT(t).Expect(k8sClient.Create(t.Context(), pdb)).To(Succeed())
	return pdb
}

// setDisruptionsAllowed plays the disruption controller: with allowed 0 the
// only healthy pod is the one the budget needs; with allowed n, n healthy
// replacements exist elsewhere.
func setDisruptionsAllowed(t *testing.T, pdb *policyv1.PodDisruptionBudget, allowed int32) {
	t.Helper()
	NewWithT(t).Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current := &policyv1.PodDisruptionBudget{}
		if err := k8sClient.Get(t.Context(), client.ObjectKeyFromObject(pdb), current); err != nil {
			return err
		}
		current.Status = policyv1.PodDisruptionBudgetStatus{
			ObservedGeneration: current.Generation,
			DisruptionsAllowed: allowed,
			CurrentHealthy:     1 + allowed,
			DesiredHealthy:     1,
			ExpectedPods:       1 + allowed,
		}
		return k8sClient.Status().Update(t.Context(), current)
	})).To(Succeed())
}

// TestDrainSpacesTheEvictionsUnderOneBudget: the apiserver's eviction
// writes the budget's status at the resourceVersion it read, so evictions
// sent together under one budget conflict and wait 500 ms each before they
// retry. A pass spaces those 25 ms apart, and sends the pods no budget
// selects as concurrently as the limits allow.
func TestDrainSpacesTheEvictionsUnderOneBudget(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t, nil)
	node := ns + "-node"
	for i := range 6 {
		newPod(t, ns, fmt.Sprintf("web-%d", i), node, withLabels(map[string]string{"app": "web"}), running())
		newPod(t, ns, fmt.Sprintf("free-%d", i), node, running())
	}
	pdb := newPDB(t, ns, "web", map[string]string{"app": "web"})
	setDisruptionsAllowed(t, pdb, 6)

	var (
		mu       sync.Mutex
		starts   []time.Time // of the budget's evictions
		inFlight int         // of the others
		most     int
	)
	c := interceptor.NewClient(k8sClient, interceptor.Funcs{
		SubResourceCreate: func(ctx context.Context, c client.Client, subResource string, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
			mu.Lock()
			free := strings.HasPrefix(obj.GetName(), "free-")
			if free {
				inFlight++
				most = max(most, inFlight)
			} else {
				starts = append(starts, time.Now())
			}
			mu.Unlock()
			if free {
				defer func() {
					mu.Lock()
					inFlight--
					mu.Unlock()
				}()
				time.Sleep(20 * time.Millisecond) // long enough for the requests to overlap
			}
			return c.SubResource(subResource).Create(ctx, obj, sub, opts...)
		},
	})
	d := drain.New(c, c, clocktesting.NewFakeClock(epoch), operatorNamespace)
	// A slow machine may leave some pods for a later pass.
	evicted := 0
	g.Eventually(func(g Gomega) {
		res, err := d.Drain(t.Context(), node, gpuhealthv1alpha1.DrainSpec{EvictionsPerSecond: 200, MaxConcurrentEvictions: 64}, epoch)
		g.Expect(err).NotTo(HaveOccurred())
		evicted += res.Evicted
		g.Expect(evicted).To(Equal(12))
	}).WithTimeout(30 * time.Second).WithPolling(10 * time.Millisecond).Should(Succeed())
	g.Expect(starts).To(HaveLen(6))
	for i := 1; i < len(starts); i++ {
		// The pacer gives a turn every 25 ms; these times are taken after
		// the turn, late by the scheduling of a goroutine, and one taken
		// late makes the next gap look short. Counted from the first, each
		// start is at least its turns in, less one such delay.
		g.Expect(starts[i].Sub(starts[0])).To(BeNumerically(">=", time.Duration(i)*25*time.Millisecond-10*time.Millisecond), "eviction %d under the budget started too soon", i)
	}
	g.Expect(most).To(BeNumerically(">", 1), "the others at once")
}
