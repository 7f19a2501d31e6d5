//go:build e2e

package e2e

import (
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
	"github.com/gpuhealth/gpuhealth/remediation/devicetaint"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// allocatedGPU is the device a pod's claim was allocated ("" if none yet),
// read from the claim the resourceclaim controller made for it.
func allocatedGPU(g Gomega, pod *corev1.Pod) string {
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.ResourceClaimName == nil {
			continue
		}
		claim := &resourcev1.ResourceClaim{}
		if err := env.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: *s.ResourceClaimName}, claim); err != nil {
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%v", err)
			continue
		}
		if a := claim.Status.Allocation; a != nil && len(a.Devices.Results) > 0 {
			return a.Devices.Results[0].Device
		}
	}
	return ""
}

// The one-GPU case's node (its index among the fake nodes) and the
// namespace of its ranks.
const (
	draNode      = "gpu-node-4"
	draNodeIndex = 4
	draNamespace = "dra"
)

// gpuPods are the ranks on draNode by the GPU their claim holds,
// and those not running on a GPU (pending).
func gpuPods(g Gomega) (byGPU map[string]corev1.Pod, pending []corev1.Pod) {
	var list corev1.PodList
	g.Expect(env.Cluster.Client.List(ctx, &list, client.InNamespace(draNamespace))).To(Succeed())
	byGPU = map[string]corev1.Pod{}
	for _, p := range list.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		dev := allocatedGPU(g, &p)
		if p.Spec.NodeName != draNode || dev == "" || p.Status.Phase != corev1.PodRunning {
			pending = append(pending, p)
			continue
		}
		byGPU[dev] = p
	}
	return byGPU, pending
}

// testDeviceQuarantineOneGPU: on a node whose eight GPUs the DRA stand-in
// publishes, eight pods each hold one GPU through a ResourceClaimTemplate.
// An XID 48 on GPU 3 takes GPU 3 alone out of service with the real
// scheduler and kube-controller-manager: a DeviceTaintRule selects it,
// only its pod is evicted (once its PodDisruptionBudget allows), its
// replacement is never allocated GPU 3 while the seven others run, the
// per-GPU Job is allocated GPU 3 itself, the rule is gone afterwards and
// GPU 3 takes the replacement. The node is never cordoned. Then two GPUs
// at once under maxDevicesPerNode 1 take the whole node out, and back.
func testDeviceQuarantineOneGPU(t *testing.T) {
	g := NewWithT(t)
	const (
		n     = draNode
		index = draNodeIndex
		ns    = draNamespace
	)
	g.Eventually(phase(n)).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	unpublish, err := framework.PublishGPUs(ctx, env.Cluster, n, index)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = unpublish(ctx) })
	t.Cleanup(func() {
		_ = env.Cluster.Client.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	deploy, err := framework.CreateRanks(ctx, env.Cluster, ns, "ranks", n, 8)
	g.Expect(err).NotTo(HaveOccurred())
	labels := deploy.Spec.Selector.MatchLabels
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "ranks", Namespace: ns},
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, MaxUnavailable: ptr.To(intstr.FromInt32(0))},
	}
	g.Expect(env.Cluster.Client.Create(ctx, pdb)).To(Succeed())
	g.Eventually(func(g Gomega) {
		byGPU, _ := gpuPods(g)
		g.Expect(byGPU).To(HaveLen(8), "every GPU of the node holds a rank")
	}).Should(Succeed())
	before, _ := gpuPods(g)
	victim := before["gpu-3"]

	injectXID(t, n, 3, 48)
	rule := devicetaint.RuleName(n, "gpu-3")
	g.Eventually(func(g Gomega) {
		r := &resourcev1.DeviceTaintRule{}
		g.Expect(env.Cluster.Client.Get(ctx, client.ObjectKey{Name: rule}, r)).To(Succeed())
		sel := r.Spec.DeviceSelector
		g.Expect([]string{*sel.Driver, *sel.Pool, *sel.Device}).To(Equal([]string{framework.GPUDriver, n, "gpu-3"}))
		g.Expect(r.Spec.Taint.Effect).To(Equal(resourcev1.DeviceTaintEffectNoSchedule))
	}).Should(Succeed())

	// The PDB allows no disruption: GPU 3 waits in Draining and says why.
	g.Eventually(func(g Gomega) {
		nh := nodeHealth(g, n)
		g.Expect(nh.Status.Devices).To(HaveLen(1))
		g.Expect(nh.Status.Devices[0].Phase).To(Equal(gpuhealthv1alpha1.DeviceDraining))
		g.Expect(nh.Status.Devices[0].Message).To(ContainSubstring("blocked by a PodDisruptionBudget"))
	}).Should(Succeed())
	g.Expect(node(g, n).Spec.Unschedulable).To(BeFalse(), "the node stays schedulable")
	g.Expect(nodeHealth(g, n).Status.Phase).To(Equal(gpuhealthv1alpha1.PhaseHealthy))
	out := kubectl(t, "get", "nodehealth", n)
	g.Expect(out).To(MatchRegexp(`GPUS OUT`), "kubectl get nodehealth shows the GPUs out:\n%s", out)

	// The budget allows one: only GPU 3's rank is evicted, and its
	// replacement waits: the seven other GPUs are taken, GPU 3 is tainted.
	g.Expect(env.Cluster.Client.Patch(ctx, pdb, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"maxUnavailable":1}}`)))).To(Succeed())
	g.Eventually(func(g Gomega) {
		p := &corev1.Pod{}
		err := env.Cluster.Client.Get(ctx, client.ObjectKeyFromObject(&victim), p)
		g.Expect(apierrors.IsNotFound(err) || err == nil && p.DeletionTimestamp != nil).To(BeTrue(), "GPU 3's rank is evicted")
	}).Should(Succeed())
	jobGPU := ""
	g.Eventually(func(g Gomega) {
		nh := nodeHealth(g, n)
		g.Expect(nh.Status.Devices).NotTo(BeEmpty())
		g.Expect(nh.Status.Devices[0].Phase).To(BeElementOf(gpuhealthv1alpha1.DeviceRecertifying))
		var pods corev1.PodList
		g.Expect(env.Cluster.Client.List(ctx, &pods, client.InNamespace(framework.Namespace),
			client.MatchingLabels{job.NodeLabel: n, job.DeviceLabel: "gpu-3"})).To(Succeed())
		g.Expect(pods.Items).NotTo(BeEmpty())
		jobGPU = allocatedGPU(g, &pods.Items[0])
		g.Expect(jobGPU).NotTo(BeEmpty())
	}).Should(Succeed())
	g.Expect(jobGPU).To(Equal("gpu-3"), "the per-GPU Job is allocated GPU 3 itself")
	after, pending := gpuPods(g)
	for dev, p := range before {
		if dev != "gpu-3" {
			g.Expect(after[dev].UID).To(Equal(p.UID), "the rank on %s was not disturbed", dev)
		}
	}
	g.Expect(after).NotTo(HaveKey("gpu-3"), "nothing new was allocated GPU 3 while it was out")
	g.Expect(pending).To(HaveLen(1), "the replacement waits")

	// The GPU passed: its rule is gone and it takes the replacement.
	g.Eventually(func(g Gomega) {
		g.Expect(nodeHealth(g, n).Status.Devices).To(BeEmpty())
		err := env.Cluster.Client.Get(ctx, client.ObjectKey{Name: rule}, &resourcev1.DeviceTaintRule{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
	}).Should(Succeed())
	g.Eventually(func(g Gomega) {
		byGPU, pending := gpuPods(g)
		g.Expect(byGPU).To(HaveKey("gpu-3"))
		g.Expect(pending).To(BeEmpty())
	}).Should(Succeed())
	g.Expect(historyPhases(nodeHealth(g, n))).NotTo(ContainElement(gpuhealthv1alpha1.PhaseQuarantined), "the node never left service")
	var notes []string
	for _, tr := range nodeHealth(g, n).Status.History {
		notes = append(notes, tr.Reason+": "+tr.Message)
	}
	g.Expect(notes).To(ContainElements(HavePrefix("DeviceQuarantined: GPU gpu-3"), HavePrefix("DeviceDraining: GPU gpu-3"),
		HavePrefix("DeviceRecertifying: GPU gpu-3"), HavePrefix("DeviceReturned: GPU gpu-3")), "the history kubectl gpuhealth story tells has each move")

	// Two GPUs at once under maxDevicesPerNode 1: the second takes the node out.
	patchPolicy(t, `{"spec":{"devices":{"maxDevicesPerNode":1}}}`)
	t.Cleanup(func() { patchPolicy(t, `{"spec":{"devices":{"maxDevicesPerNode":2}}}`) })
	injectXID(t, n, 1, 48)
	g.Eventually(func(g Gomega) { g.Expect(nodeHealth(g, n).Status.Devices).To(HaveLen(1)) }).Should(Succeed())
	injectXID(t, n, 2, 48)
	g.Eventually(func(g Gomega) bool { return quarantined(g, n) }).Should(BeTrue(), "the node is cordoned and tainted")
	g.Eventually(func(g Gomega) {
		e := event(n, gpuhealthv1alpha1.CheckXID, framework.GPUUUID(index, 2), "48")(g)
		g.Expect(e.Status.Classification).NotTo(BeNil())
		g.Expect(e.Status.Classification.Reason).To(ContainSubstring("more than devices.maxDevicesPerNode 1"))
	}).Should(Succeed(), "the finding says why the node went out")
	g.Expect(env.Cluster.Client.Delete(ctx, deploy)).To(Succeed())
	g.Eventually(phase(n), 3*time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	g.Eventually(func(g Gomega) {
		g.Expect(nodeHealth(g, n).Status.Devices).To(BeEmpty(), "the node's recertification covered its GPUs")
		var rules resourcev1.DeviceTaintRuleList
		g.Expect(env.Cluster.Client.List(ctx, &rules, client.MatchingLabels{devicetaint.NodeLabel: n})).To(Succeed())
		g.Expect(rules.Items).To(BeEmpty(), fmt.Sprint("no rule is left on ", n))
	}).Should(Succeed())
}
