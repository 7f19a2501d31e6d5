package nodehealth

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/breaker"
	"github.com/gpuhealth/gpuhealth/remediation/devicetaint"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// draNode publishes the node's eight GPUs as NVIDIA's DRA driver does
// (pool = node, gpu-<minor>, a uuid attribute) and returns their UUIDs.
func (h *harness) draNode(node string) []string {
	h.t.Helper()
	s := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu.nvidia.com"},
		Spec: resourcev1.ResourceSliceSpec{Driver: devicetaint.DefaultDriver, NodeName: ptr.To(node),
			Pool: resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1}},
	}
	uuids := make([]string, 8)
	for i := range uuids {
		uuids[i] = fmt.Sprintf("GPU-%08d-aaaa-4bbb-8ccc-%012d", len(node), i)
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				"type": {StringValue: ptr.To("gpu")}, "uuid": {StringValue: ptr.To(uuids[i])},
			}})
	}
	h.g.Expect(k8sClient.Create(h.ctx, s)).To(Succeed())
	h.t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), s) })
	return uuids
}

// claimedPod creates a running pod on node whose claim is allocated gpu-<i>
// and reserved for the pod, as the scheduler leaves them.
func (h *harness) claimedPod(node, name string, i int) *corev1.Pod {
	h.t.Helper()
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-gpu", Namespace: "default"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"},
		}}}},
	}
	h.g.Expect(k8sClient.Create(h.ctx, claim)).To(Succeed())
	h.t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), claim) })
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: node, ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}},
			Containers: []corev1.Container{{Name: "train", Image: "trainer", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}}},
	}
	h.g.Expect(k8sClient.Create(h.ctx, p)).To(Succeed())
	h.t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), p, client.GracePeriodSeconds(0)) })
	claim.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: devicetaint.DefaultDriver, Pool: node, Device: fmt.Sprintf("gpu-%d", i),
	}}}}
	claim.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: p.Name, UID: p.UID}}
	h.g.Expect(k8sClient.Status().Update(h.ctx, claim)).To(Succeed())
	return p
}

// gpuFault creates a finding of XID 48 (one GPU's, reset clears it) on the GPU uuid.
func (h *harness) gpuFault(node, uuid string) *gpuhealthv1alpha1.NodeHealthEvent {
	h.t.Helper()
	spec := gpuhealthv1alpha1.NodeHealthEventSpec{
		NodeName: node, Source: gpuhealthv1alpha1.SourceNVML, Check: gpuhealthv1alpha1.CheckXID, Code: "48", Severity: gpuhealthv1alpha1.SeverityFatal,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: uuid}, Message: "test finding",
	}
	return h.finding(spec)
}

func perGPUPolicy(s *gpuhealthv1alpha1.RemediationPolicySpec) {
	s.Rules = []gpuhealthv1alpha1.Rule{{Name: "per-gpu", Match: gpuhealthv1alpha1.RuleMatch{Codes: []string{"48"}},
		Verdict: gpuhealthv1alpha1.VerdictQuarantine, Action: gpuhealthv1alpha1.ActionResetGPU, Scope: gpuhealthv1alpha1.ScopeDevice}}
	s.Devices = &gpuhealthv1alpha1.DeviceQuarantineSpec{Job: &gpuhealthv1alpha1.JobTemplate{Image: "dcgm", Command: []string{"dcgmi", "diag", "-r", "2"}}}
}

// TestDeviceQuarantineCycle: an XID 48 on GPU 3 takes GPU 3 alone out of
// service, on the real apiserver: a DeviceTaintRule selecting the driver,
// pool and device; only the pod whose claim holds GPU 3 is evicted; a Job
// claims GPU 3 by its uuid; once it passed the rule and the claim template
// are gone, the finding is closed, and the node was never cordoned.
func TestDeviceQuarantineCycle(t *testing.T) {
	h := newHarness(t)
	h.policy(perGPUPolicy)
	n := h.node("a", nil)
	uuids := h.draNode(n.Name)
	holder := h.claimedPod(n.Name, h.label+"-holder", 3)
	other := h.claimedPod(n.Name, h.label+"-other", 1)
	h.reconcile(n.Name)

	ev := h.gpuFault(n.Name, uuids[3])
	h.reconcile(n.Name)
	nh := h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(healthy))
	h.g.Expect(nh.Status.Devices).To(HaveLen(1))
	h.g.Expect(nh.Status.Devices[0].Device).To(Equal("gpu-3"))
	rule := &resourcev1.DeviceTaintRule{}
	h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Name: devicetaint.RuleName(n.Name, "gpu-3")}, rule)).To(Succeed())
	sel := rule.Spec.DeviceSelector
	h.g.Expect([]string{*sel.Driver, *sel.Pool, *sel.Device}).To(Equal([]string{"gpu.nvidia.com", n.Name, "gpu-3"}))
	h.g.Expect(rule.Spec.Taint.Effect).To(Equal(resourcev1.DeviceTaintEffectNoSchedule))
	h.g.Expect(rule.Spec.Taint.TimeAdded).NotTo(BeNil(), "stamped by the apiserver")

	// The next pass sees the rule and drains: the holder is evicted, the other pod stays.
	h.reconcile(n.Name)
	h.reconcile(n.Name)
	h.g.Expect(h.nodeHealth(n.Name).Status.Devices[0].Phase).To(Equal(gpuhealthv1alpha1.DeviceDraining))
	got := &corev1.Pod{}
	h.g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(holder), got)).To(Succeed())
	h.g.Expect(got.DeletionTimestamp).NotTo(BeNil(), "the holder was evicted")
	h.g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(other), got)).To(Succeed())
	h.g.Expect(got.DeletionTimestamp).To(BeNil(), "a pod on another GPU stays")
	h.g.Expect(h.getNode(n.Name).Spec.Unschedulable).To(BeFalse(), "the node stays schedulable")
	c := gpuHealthyCondition(h.getNode(n.Name))
	h.g.Expect(c.Status).To(Equal(corev1.ConditionTrue))
	h.g.Expect(c.Message).To(ContainSubstring("gpu-3 (Draining)"), "the Node's GPUHealthy names the GPU out")

	// The holder is gone: the GPU's test Job claims GPU 3 by uuid.
	h.g.Expect(h.playKubelet(n.Name)).To(Equal(1))
	h.reconcile(n.Name)
	e := h.nodeHealth(n.Name).Status.Devices[0]
	h.g.Expect(e.Phase).To(Equal(gpuhealthv1alpha1.DeviceRecertifying))
	dev := job.Device{Node: n.Name, Name: "gpu-3", UUID: uuids[3], Driver: devicetaint.DefaultDriver}
	name := job.DeviceName(job.DeviceRecertification, dev, 1, e.AttemptStartedAt.Time)
	rct := &resourcev1.ResourceClaimTemplate{}
	h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Namespace: jobNamespace, Name: name}, rct)).To(Succeed())
	h.g.Expect(rct.Spec.Spec.Devices.Requests[0].Exactly.Selectors[0].CEL.Expression).To(ContainSubstring(uuids[3]))
	j := &batchv1.Job{}
	h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Namespace: jobNamespace, Name: name}, j)).To(Succeed())
	h.g.Expect(j.Spec.Template.Spec.Containers[0].Env).To(ContainElement(corev1.EnvVar{Name: job.GPUUUIDEnv, Value: uuids[3]}))

	// Passed: the GPU is back, its rule and claim template gone, its finding closed.
	h.finishJob(name, true)
	h.reconcile(n.Name)
	nh = h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Devices).To(BeEmpty())
	err := k8sClient.Get(h.ctx, types.NamespacedName{Name: rule.Name}, rule)
	h.g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the rule is deleted: %v", err)
	err = k8sClient.Get(h.ctx, types.NamespacedName{Namespace: jobNamespace, Name: name}, rct)
	h.g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the claim template is deleted: %v", err)
	closed := &gpuhealthv1alpha1.NodeHealthEvent{}
	h.g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(ev), closed)).To(Succeed())
	h.g.Expect(closed.Status.Phase).To(Equal(gpuhealthv1alpha1.EventSuperseded))
	h.g.Expect(historyPhases(nh)).NotTo(ContainElement(quarantined), "the node itself never left service")
	h.g.Expect(h.events()).To(ContainElement(ContainSubstring("DeviceReturned")))
}

// TestDeviceEscalatesWhenNotPublished: a finding of scope Device on a GPU
// no DRA driver publishes takes the node out, saying why.
func TestDeviceEscalatesWhenNotPublished(t *testing.T) {
	h := newHarness(t)
	h.policy(perGPUPolicy)
	n := h.node("a", nil)
	h.reconcile(n.Name)
	ev := h.gpuFault(n.Name, "GPU-00000000-dead-4bbb-8ccc-000000000009")
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).NotTo(Equal(healthy))
	got := &gpuhealthv1alpha1.NodeHealthEvent{}
	h.g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(ev), got)).To(Succeed())
	h.g.Expect(got.Status.Classification.Reason).To(ContainSubstring("not published by DRA driver gpu.nvidia.com"))
	h.g.Expect(h.nodeHealth(n.Name).Status.Devices).To(BeEmpty())
}

// TestDeviceDryRunReportsWhatWouldBeEvicted: under a dry-run policy the
// GPU's rule has the effect None, nothing is evicted, and what
// kube-controller-manager says the rule would have evicted is the GPU's
// wouldEvict.
func TestDeviceDryRunReportsWhatWouldBeEvicted(t *testing.T) {
	h := newHarness(t)
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		perGPUPolicy(s)
		s.DryRun = true
	})
	n := h.node("a", nil)
	uuids := h.draNode(n.Name)
	holder := h.claimedPod(n.Name, h.label+"-holder", 2)
	h.reconcile(n.Name)
	h.gpuFault(n.Name, uuids[2])
	h.reconcile(n.Name)
	rule := &resourcev1.DeviceTaintRule{}
	h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Name: devicetaint.RuleName(n.Name, "gpu-2")}, rule)).To(Succeed())
	h.g.Expect(rule.Spec.Taint.Effect).To(Equal(resourcev1.DeviceTaintEffectNone))

	// kube-controller-manager's device-taint eviction controller counts.
	rule.Status.Conditions = []metav1.Condition{{Type: resourcev1.DeviceTaintConditionEvictionInProgress, Status: metav1.ConditionFalse,
		Reason: "NoEffect", ObservedGeneration: rule.Generation, LastTransitionTime: metav1.NewTime(h.clock.Now()),
		Message: "1 published devices selected. 1 allocated devices selected. 1 pods would be evicted in 1 namespace(s) if the effect was NoExecute. This information will not be updated again. Recreate the DeviceTaintRule to trigger an update."}}
	h.g.Expect(k8sClient.Status().Update(h.ctx, rule)).To(Succeed())
	h.reconcile(n.Name)
	e := h.nodeHealth(n.Name).Status.Devices[0]
	h.g.Expect(e.Phase).To(Equal(gpuhealthv1alpha1.DeviceQuarantined), "a dry run never drains")
	h.g.Expect(e.WouldEvict).To(Equal(ptr.To[int32](1)))
	got := &corev1.Pod{}
	h.g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(holder), got)).To(Succeed())
	h.g.Expect(got.DeletionTimestamp).To(BeNil(), "nothing is evicted")
	h.g.Expect(h.events()).To(ContainElement(ContainSubstring("would have evicted 1 pods")))
}

// secondGPUHeld takes GPU 0 of a node "a" out alone, then finds GPU 0 of
// a node "b" held back (by the policy's breaker or budget): it returns a,
// a's GPU UUIDs and b's NodeHealth.
func (h *harness) secondGPUHeld() (*corev1.Node, []string, *gpuhealthv1alpha1.NodeHealth) {
	h.t.Helper()
	a, b := h.node("a", nil), h.node("b", nil)
	ua, ub := h.draNode(a.Name), h.draNode(b.Name)
	h.reconcile(a.Name)
	h.reconcile(b.Name)
	h.gpuFault(a.Name, ua[0])
	h.reconcile(a.Name)
	h.g.Expect(h.nodeHealth(a.Name).Status.Devices).To(HaveLen(1))
	h.gpuFault(b.Name, ub[0])
	h.reconcile(b.Name)
	nh := h.nodeHealth(b.Name)
	h.g.Expect(nh.Status.Devices).To(BeEmpty(), "the second GPU is held back")
	return a, ua, nh
}

// TestDeviceBreakerCountsGPUs: the device breaker, its threshold taken of
// the managed GPUs, holds a second GPU back while the node breaker, which
// counts nodes, is untouched.
func TestDeviceBreakerCountsGPUs(t *testing.T) {
	h := newHarness(t)
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		perGPUPolicy(s)
		s.CircuitBreaker.Threshold = ptr.To(intstr.FromInt32(1))
		s.CircuitBreaker.Window = dur("10m")
		s.CircuitBreaker.CoolDown = dur("30m")
	})
	_, _, nh := h.secondGPUHeld()
	h.g.Expect(nh.Status.Phase).To(Equal(healthy), "and not taken out with its node")
	c := meta.FindStatusCondition(nh.Status.Conditions, gpuhealthv1alpha1.NodeHealthDevicesOutOfServiceCondition)
	h.g.Expect(c).NotTo(BeNil())
	h.g.Expect(c.Reason).To(Equal(gpuhealthv1alpha1.ReasonDeviceHeld))
	h.g.Expect(c.Message).To(ContainSubstring("device circuit breaker"))
	allowed, _ := h.r.Breaker.Check(h.label, breaker.Settings{Limit: 1, Window: 10 * time.Minute, CoolDown: 30 * time.Minute}, h.clock.Now())
	h.g.Expect(allowed).To(BeTrue(), "the node breaker counted no device")
}

// TestDeviceBudgetCountsFromTheAPIServer: maxUnavailableDevices 1 lets
// one GPU out; a second node's GPU waits, counted from the apiserver
// under the admission lock, and goes out once the first is back.
func TestDeviceBudgetCountsFromTheAPIServer(t *testing.T) {
	h := newHarness(t)
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		perGPUPolicy(s)
		s.CircuitBreaker.Enabled = ptr.To(false)
		s.Budgets.MaxUnavailableDevices = ptr.To(intstr.FromInt32(1))
	})
	a, ua, nh := h.secondGPUHeld()
	b := nh.Name
	c := meta.FindStatusCondition(nh.Status.Conditions, gpuhealthv1alpha1.NodeHealthDevicesOutOfServiceCondition)
	h.g.Expect(c).NotTo(BeNil())
	h.g.Expect(c.Message).To(ContainSubstring("budget maxUnavailableDevices allows 1 GPUs out, 1 are"))

	// The first GPU passes and returns: the second goes out.
	h.reconcile(a.Name)
	h.reconcile(a.Name)
	e := h.nodeHealth(a.Name).Status.Devices[0]
	h.g.Expect(e.Phase).To(Equal(gpuhealthv1alpha1.DeviceRecertifying))
	h.finishJob(job.DeviceName(job.DeviceRecertification, job.Device{Node: a.Name, Name: "gpu-0", UUID: ua[0], Driver: devicetaint.DefaultDriver}, 1, e.AttemptStartedAt.Time), true)
	h.reconcile(a.Name)
	h.g.Expect(h.nodeHealth(a.Name).Status.Devices).To(BeEmpty())
	h.reconcile(b)
	h.g.Expect(h.nodeHealth(b).Status.Devices).To(HaveLen(1))
}
