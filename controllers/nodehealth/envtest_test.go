package nodehealth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/policy"
	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
	"github.com/gpuhealth/gpuhealth/remediation/breaker"
	"github.com/gpuhealth/gpuhealth/remediation/drain"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

var (
	testScheme *runtime.Scheme
	k8sClient  client.WithWatch
	testEnv    *envtest.Environment
)

const jobNamespace = "gpuhealth-system"

// testJobRules are the install's Job rules the tests run under: the tests'
// images (whole names as prefixes: "dcgm", "reset", …), every kind
// privileged, gpuhealth's own accounts reserved.
var testJobRules = job.Rules{
	ServiceAccount: job.DefaultServiceAccount, Reserved: []string{FieldManager, "gpuhealth-monitor"},
	PrivilegedKinds: job.Kinds, ImagePrefixes: []string{"dcgm", "nccl", "reset", "reboot"},
}

// TestMain starts the control plane with gpuhealth's CRDs; the
// ComputeDomain tests install NVIDIA's CRDs in each driver shape
// (testenv.DriverShapes).
func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(e *testenv.Env) error {
		testScheme, k8sClient, testEnv = e.Scheme, e.Client, e.Environment
		return k8sClient.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: jobNamespace}})
	}))
}

// harness is one test's reconciler with a fake clock and recorder, driven
// step by step with reconcile().
type harness struct {
	t        *testing.T
	g        *WithT
	ctx      context.Context
	clock    *clocktesting.FakeClock
	recorder *events.FakeRecorder
	r        *Reconciler
	label    string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	rec := events.NewFakeRecorder(1000)
	h := &harness{
		t: t, g: NewWithT(t), ctx: context.Background(), clock: clk, recorder: rec,
		label: strings.ToLower(strings.NewReplacer("/", "-", "_", "-", ".", "-").Replace(t.Name())),
	}
	if len(h.label) > 50 {
		// Keep subtests apart: the cut name and a hash of the whole.
		sum := sha256.Sum256([]byte(t.Name()))
		h.label = strings.TrimRight(h.label[:41], "-") + "-" + hex.EncodeToString(sum[:])[:8]
	}
	h.label = strings.TrimRight(h.label, "-")
	h.r = &Reconciler{
		Client: client.WithFieldOwner(k8sClient, FieldManager), APIReader: k8sClient, Clock: clk, Recorder: rec,
		HandOff: client.WithFieldOwner(k8sClient, FieldManager),
		Drainer: drain.New(k8sClient, k8sClient, clk, jobNamespace), Breaker: breaker.New(), Namespace: jobNamespace, DriverNamespace: driverNamespace, JobRules: testJobRules,
		expect: newExpectations(clk),
	}
	return h
}

// policy creates a RemediationPolicy that selects only this test's nodes.
func (h *harness) policy(mutate func(*gpuhealthv1alpha1.RemediationPolicySpec)) *gpuhealthv1alpha1.RemediationPolicy {
	h.t.Helper()
	p := &gpuhealthv1alpha1.RemediationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: h.label},
		Spec: gpuhealthv1alpha1.RemediationPolicySpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"test": h.label}},
		},
	}
	if mutate != nil {
		mutate(&p.Spec)
	}
	h.g.Expect(k8sClient.Create(h.ctx, p)).To(Succeed())
	h.t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), p) })
	return p
}

// node creates a GPU node of this test.
func (h *harness) node(name string, mutate func(*corev1.Node)) *corev1.Node {
	h.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   h.label + "-" + name,
		Labels: map[string]string{"test": h.label, "nvidia.com/gpu.present": "true"},
	}}
	if mutate != nil {
		mutate(n)
	}
	h.g.Expect(k8sClient.Create(h.ctx, n)).To(Succeed())
	h.t.Cleanup(func() {
		_ = k8sClient.Delete(context.Background(), n)
		_ = k8sClient.Delete(context.Background(), &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: n.Name}})
	})
	return n
}

// fault creates a Fatal finding about node as a monitor would, seen now.
func (h *harness) fault(node string, check gpuhealthv1alpha1.Check, code string) *gpuhealthv1alpha1.NodeHealthEvent {
	h.t.Helper()
	spec := gpuhealthv1alpha1.NodeHealthEventSpec{
		NodeName: node, Source: gpuhealthv1alpha1.SourceNVML, Check: check, Code: code, Severity: gpuhealthv1alpha1.SeverityFatal,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "GPU-0000"},
		Message:   "test finding",
	}
	if check == gpuhealthv1alpha1.CheckNVLinkErrors {
		spec.Component = gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVLink, ID: "GPU-0000/link-1"}
	}
	return h.finding(spec)
}

// finding creates a finding of spec, seen once just now.
func (h *harness) finding(spec gpuhealthv1alpha1.NodeHealthEventSpec) *gpuhealthv1alpha1.NodeHealthEvent {
	h.t.Helper()
	ev := &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: spec.EventName()}, Spec: spec}
	h.g.Expect(k8sClient.Create(h.ctx, ev)).To(Succeed())
	h.t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), ev) })
	now := metav1.NewTime(h.clock.Now())
	ev.Status = gpuhealthv1alpha1.NodeHealthEventStatus{Count: 1, FirstSeen: &now, LastSeen: &now}
	h.g.Expect(k8sClient.Status().Update(h.ctx, ev)).To(Succeed())
	return ev
}

// pod creates a running workload pod on node.
func (h *harness) pod(node, name string, lbls map[string]string) *corev1.Pod {
	h.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: lbls},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "train", Image: "trainer"}},
		},
	}
	h.g.Expect(k8sClient.Create(h.ctx, p)).To(Succeed())
	h.t.Cleanup(func() {
		_ = k8sClient.Delete(context.Background(), p, client.GracePeriodSeconds(0))
	})
	return p
}

// reconcile runs one Reconcile of node and returns the result. When the
// pass only fenced the node, it runs the bookkeeping pass that follows, as
// the workqueue would a millisecond later.
func (h *harness) reconcile(node string) ctrl.Result {
	h.t.Helper()
	res := h.reconcileOnce(node)
	// Follow-up passes the reconciler asks for at once — the bookkeeping
	// after a fence, the drain after the budget's slot is written, the pass
	// after a recertification attempt was written down — are part of the
	// same step.
	for range 8 {
		if (res.Priority == nil || *res.Priority != fencedPriority) && res.RequeueAfter != time.Millisecond {
			break
		}
		res = h.reconcileOnce(node)
	}
	return res
}

func (h *harness) reconcileOnce(node string) ctrl.Result {
	h.t.Helper()
	res, err := h.r.Reconcile(h.ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: node}})
	h.g.Expect(err).NotTo(HaveOccurred())
	return res
}

// syncPolicy runs the policy status controller once for a policy, with the
// harness's breaker, as the operator's would after the breaker changed.
func (h *harness) syncPolicy(name string) *gpuhealthv1alpha1.RemediationPolicy {
	h.t.Helper()
	r := &policy.Reconciler{Client: k8sClient, Clock: h.clock, Recorder: h.recorder, Breaker: h.r.Breaker, JobRules: h.r.JobRules}
	_, err := r.Reconcile(h.ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: name}})
	h.g.Expect(err).NotTo(HaveOccurred())
	got := &gpuhealthv1alpha1.RemediationPolicy{}
	h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Name: name}, got)).To(Succeed())
	return got
}

// humanUncordon uncordons node as a human would (kubectl uncordon).
func (h *harness) humanUncordon(name string) {
	h.t.Helper()
	node := h.getNode(name)
	node.Spec.Unschedulable = false
	h.g.Expect(k8sClient.Update(h.ctx, node)).To(Succeed())
}

// events returns the Events published since the last call, each as
// "Type Reason note".
func (h *harness) events() []string {
	var out []string
	for {
		select {
		case e := <-h.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func (h *harness) nodeHealth(node string) *gpuhealthv1alpha1.NodeHealth {
	h.t.Helper()
	nh := &gpuhealthv1alpha1.NodeHealth{}
	h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Name: node}, nh)).To(Succeed())
	return nh
}

func (h *harness) getNode(name string) *corev1.Node {
	h.t.Helper()
	n := &corev1.Node{}
	h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Name: name}, n)).To(Succeed())
	return n
}

func (h *harness) phase(node string) gpuhealthv1alpha1.NodeHealthPhase {
	return h.nodeHealth(node).Status.Phase
}

// playKubelet removes pods that were evicted (envtest has no kubelet to
// finish their graceful deletion).
func (h *harness) playKubelet(node string) int {
	h.t.Helper()
	pods := &corev1.PodList{}
	h.g.Expect(k8sClient.List(h.ctx, pods, client.MatchingFields{"spec.nodeName": node})).To(Succeed())
	n := 0
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp != nil {
			h.g.Expect(client.IgnoreNotFound(k8sClient.Delete(h.ctx, &pods.Items[i], client.GracePeriodSeconds(0)))).To(Succeed())
			n++
		}
	}
	return n
}

// finishJob plays the Job controller: it marks the Job succeeded or failed.
func (h *harness) finishJob(name string, succeeded bool) {
	h.t.Helper()
	j := &batchv1.Job{}
	h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Namespace: jobNamespace, Name: name}, j)).To(Succeed())
	now := metav1.NewTime(h.clock.Now())
	start := metav1.NewTime(now.Add(-time.Minute))
	j.Status.StartTime = &start
	if succeeded {
		j.Status.Succeeded = 1
		j.Status.CompletionTime = &now
		j.Status.Conditions = []batchv1.JobCondition{
			{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now},
			{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now},
		}
	} else {
		j.Status.Failed = 1
		j.Status.Conditions = []batchv1.JobCondition{
			{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", Message: "dcgmi diag failed", LastProbeTime: now, LastTransitionTime: now},
			{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", Message: "dcgmi diag failed", LastProbeTime: now, LastTransitionTime: now},
		}
	}
	h.g.Expect(k8sClient.Status().Update(h.ctx, j)).To(Succeed())
	h.t.Cleanup(func() {
		_ = k8sClient.Delete(context.Background(), j, client.PropagationPolicy(metav1.DeletePropagationBackground))
	})
}

// jobName is the name of the node's Job of a kind for an attempt: the
// current attempt's (names carry the attempt's start), else the newest such
// Job, else a name that does not exist.
func (h *harness) jobName(kind job.Kind, node string, attempt int32) string {
	h.t.Helper()
	if rc := h.nodeHealth(node).Status.Recertification; rc != nil && rc.StartedAt != nil && rc.Attempt == attempt {
		return job.Name(kind, node, attempt, rc.StartedAt.Time)
	}
	list := &batchv1.JobList{}
	h.g.Expect(k8sClient.List(h.ctx, list, client.InNamespace(jobNamespace), client.MatchingLabels{
		job.NodeLabel: node, job.KindLabel: string(kind), job.AttemptLabel: strconv.Itoa(int(attempt)),
	})).To(Succeed())
	name := job.Name(kind, node, attempt, time.Time{})
	var newest time.Time
	for _, j := range list.Items {
		if j.CreationTimestamp.After(newest) {
			name, newest = j.Name, j.CreationTimestamp.Time
		}
	}
	return name
}

func (h *harness) jobExists(name string) bool {
	err := k8sClient.Get(h.ctx, types.NamespacedName{Namespace: jobNamespace, Name: name}, &batchv1.Job{})
	if apierrors.IsNotFound(err) {
		return false
	}
	h.g.Expect(err).NotTo(HaveOccurred())
	return true
}

// historyPhases is the list of phases the node entered, in order.
func historyPhases(nh *gpuhealthv1alpha1.NodeHealth) []gpuhealthv1alpha1.NodeHealthPhase {
	var out []gpuhealthv1alpha1.NodeHealthPhase
	for _, t := range nh.Status.History {
		out = append(out, t.To)
	}
	return out
}

func hasQuarantineTaint(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == quarantineTaint {
			return true
		}
	}
	return false
}

func jobTemplate() *gpuhealthv1alpha1.JobTemplate {
	return &gpuhealthv1alpha1.JobTemplate{Image: "dcgm", Command: []string{"dcgmi", "diag", "-r", "2"}}
}

func dur(s string) *gpuhealthv1alpha1.Duration { return ptr.To(gpuhealthv1alpha1.Duration(s)) }

func intstrFromInt(i int) intstr.IntOrString { return intstr.FromInt32(int32(i)) }
