package nodehealth

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/cachetrim"
	"github.com/gpuhealth/gpuhealth/controllers/index"
	"github.com/gpuhealth/gpuhealth/remediation/breaker"
	"github.com/gpuhealth/gpuhealth/remediation/drain"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// startTrimmedManager runs the reconciler in a manager whose cache has the
// operator's options (cachetrim.CacheOptions, as main.go passes them) and
// whose writes name the operator's field manager.
func startTrimmedManager(t *testing.T, outputs job.OutputReader) {
	t.Helper()
	g := NewWithT(t)
	mgr, err := ctrl.NewManager(testEnv.Config, ctrl.Options{
		Scheme:     testScheme,
		Client:     client.Options{FieldOwner: FieldManager},
		Cache:      cachetrim.CacheOptions(jobNamespace, driverNamespace),
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	g.Expect(err).NotTo(HaveOccurred())
	clk := clock.RealClock{}
	r := &Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), HandOff: k8sClient, Clock: clk,
		Recorder: mgr.GetEventRecorder(FieldManager), Drainer: drain.New(mgr.GetClient(), k8sClient, clk, jobNamespace),
		Breaker: breaker.New(), Namespace: jobNamespace, DriverNamespace: driverNamespace, JobRules: testJobRules, Outputs: outputs, MaxConcurrentReconciles: 4,
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.Expect(index.Register(ctx, mgr.GetFieldIndexer())).To(Succeed())
	g.Expect(r.SetupWithManager(ctx, mgr)).To(Succeed())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		g.Expect(<-done).To(Succeed())
	})
}

// bulkyPod is a pod the way a real workload carries it, beside the fields
// the operator reads: env, mounts, volumes, tolerations, annotations.
func (h *harness) bulkyPod(node, name string, mutate func(*corev1.Pod)) *corev1.Pod {
	h.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "default", Labels: map[string]string{"app": h.label},
			Annotations: map[string]string{"example.com/config": "{\"large\": true}"},
		},
		Spec: corev1.PodSpec{
			NodeName: node,
			Containers: []corev1.Container{{
				Name: "train", Image: "trainer", Env: []corev1.EnvVar{{Name: "NCCL_DEBUG", Value: "INFO"}},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes:     []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			Tolerations: []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists}},
		},
	}
	if mutate != nil {
		mutate(p)
	}
	h.g.Expect(k8sClient.Create(h.ctx, p)).To(Succeed())
	h.t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), p, client.GracePeriodSeconds(0)) })
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = "10.0.0.9"
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "train", Ready: true, Image: "trainer", ImageID: "sha256:0"}}
	h.g.Expect(k8sClient.Status().Update(h.ctx, p)).To(Succeed())
	return p
}

func (h *harness) status(node string) string {
	nh := &gpuhealthv1alpha1.NodeHealth{}
	if err := k8sClient.Get(h.ctx, types.NamespacedName{Name: node}, nh); err != nil {
		return err.Error()
	}
	return string(nh.Status.Phase) + "/" + nh.Status.Reason
}

// TestTrimmedCacheDrainsAndReturns: with the operator's trimmed cache the
// drain still tells DaemonSet and mirror pods from workloads, names the
// PodDisruptionBudget that blocks one, and finishes the cycle; the node's
// images, addresses and nodeInfo, which the cache does not hold, survive
// every write the cycle makes to it.
func TestTrimmedCacheDrainsAndReturns(t *testing.T) {
	h := newHarness(t)
	g := h.g
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Recertification.Job = jobTemplate()
		s.Recertification.SoakWindow = dur("0s")
	})
	n := h.node("a", nil)
	now := metav1.Now()
	n.Status = corev1.NodeStatus{
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: now, LastTransitionTime: now}},
		Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.9"}},
		NodeInfo:   corev1.NodeSystemInfo{BootID: "boot-1", KernelVersion: "6.8.0", KubeletVersion: "v1.37.2"},
		Images:     []corev1.ContainerImage{{Names: []string{"trainer"}, SizeBytes: 20 << 30}},
	}
	g.Expect(k8sClient.Status().Update(h.ctx, n)).To(Succeed())
	workload := h.bulkyPod(n.Name, h.label+"-trainer", nil)
	daemon := h.bulkyPod(n.Name, h.label+"-daemon", func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", UID: "0f6b1e2a-0000-4000-8000-000000000002"}}
	})
	mirror := h.bulkyPod(n.Name, h.label+"-mirror", func(p *corev1.Pod) {
		p.Annotations[corev1.MirrorPodAnnotationKey] = "abc"
	})
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: h.label, Namespace: "default"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": h.label}},
		},
	}
	g.Expect(k8sClient.Create(h.ctx, pdb)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), pdb) })
	setDisruptionsAllowed := func(n int32) {
		g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(pdb), pdb)).To(Succeed())
		pdb.Status = policyv1.PodDisruptionBudgetStatus{
			ObservedGeneration: pdb.Generation, DisruptionsAllowed: n,
			CurrentHealthy: 1, DesiredHealthy: 1 - n, ExpectedPods: 1,
		}
		g.Expect(k8sClient.Status().Update(h.ctx, pdb)).To(Succeed())
	}
	setDisruptionsAllowed(0)
	before := h.getNode(n.Name)

	startTrimmedManager(t, nil)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	g.Eventually(func() string { return h.status(n.Name) }, 20*time.Second, 100*time.Millisecond).Should(Equal("Draining/BlockedByPDB"))
	nh := h.nodeHealth(n.Name)
	g.Expect(nh.Status.Drain.Blocked).To(HaveLen(1), "the DaemonSet and mirror pods are not drained")
	g.Expect(nh.Status.Drain.Blocked[0].Name).To(Equal(workload.Name))
	g.Expect(nh.Status.Drain.Blocked[0].PodDisruptionBudget).To(Equal(pdb.Name), "matched on the cached pod's labels")

	setDisruptionsAllowed(1)
	var recert string
	g.Eventually(func() bool {
		h.playKubelet(n.Name)
		recert = h.jobName(job.Recertification, n.Name, 1)
		return h.jobExists(recert)
	}, 30*time.Second, 100*time.Millisecond).Should(BeTrue())
	h.finishJob(recert, true)
	g.Eventually(func() gpuhealthv1alpha1.NodeHealthPhase { return h.phase(n.Name) }, 20*time.Second, 100*time.Millisecond).Should(Equal(healthy))
	g.Eventually(func() bool { return h.getNode(n.Name).Spec.Unschedulable }, 10*time.Second, 100*time.Millisecond).Should(BeFalse())

	for _, p := range []*corev1.Pod{daemon, mirror} {
		cur := &corev1.Pod{}
		g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(p), cur)).To(Succeed())
		g.Expect(cur.DeletionTimestamp).To(BeNil(), "%s is left alone", p.Name)
	}
	after := h.getNode(n.Name)
	g.Expect(after.Status.Images).To(Equal(before.Status.Images))
	g.Expect(after.Status.Addresses).To(Equal(before.Status.Addresses))
	g.Expect(after.Status.NodeInfo).To(Equal(before.Status.NodeInfo))
	g.Expect(after.Status.Conditions).To(ContainElement(HaveField("Type", corev1.NodeReady)), "the GPUHealthy write keeps the kubelet's conditions")
	g.Expect(gpuHealthyCondition(after)).NotTo(BeNil())
	g.Expect(after.Spec.Taints).To(Equal(before.Spec.Taints), "only what gpuhealth added is lifted")
}

// TestTrimmedCacheNamesWhoActed: the cached Node's managedFields entries
// (kept without their fieldsV1) still name who uncordoned it, and the
// cached NodeHealth's spec entries who wrote a manual request.
func TestTrimmedCacheNamesWhoActed(t *testing.T) {
	h := newHarness(t)
	g := h.g
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) { s.Recertification.SoakWindow = dur("1h") })
	a := h.node("a", nil)
	b := h.node("b", nil)
	startTrimmedManager(t, nil)
	g.Eventually(func() string { return h.status(b.Name) }, 20*time.Second, 100*time.Millisecond).Should(HavePrefix("Healthy/"))

	h.fault(a.Name, gpuhealthv1alpha1.CheckXID, "79")
	g.Eventually(func() string { return h.status(a.Name) }, 20*time.Second, 100*time.Millisecond).Should(HavePrefix("Recertifying/"))
	// Entry times have whole seconds: the uncordon comes in a later one.
	time.Sleep(1100 * time.Millisecond)
	node := h.getNode(a.Name)
	node.Spec.Unschedulable = false
	node.Labels["team"] = "infra"
	g.Expect(client.WithFieldOwner(k8sClient, "node-admin-tool").Update(h.ctx, node)).To(Succeed())
	g.Eventually(func() string { return h.status(a.Name) }, 20*time.Second, 100*time.Millisecond).Should(Equal("Healthy/" + gpuhealthv1alpha1.ReasonHumanUncordon))
	nh := h.nodeHealth(a.Name)
	g.Expect(nh.Status.History[len(nh.Status.History)-1].By).To(HavePrefix("manager node-admin-tool (Update at "))

	nh = h.nodeHealth(b.Name)
	nh.Spec.Request = &gpuhealthv1alpha1.ManualRequest{Action: gpuhealthv1alpha1.RequestRecertify, ID: "riser-swap", RequestedBy: "bob"}
	g.Expect(client.WithFieldOwner(k8sClient, "oncall-tool").Update(h.ctx, nh)).To(Succeed())
	g.Eventually(func() string {
		if lr := h.nodeHealth(b.Name).Status.LastRequest; lr != nil {
			return lr.By
		}
		return ""
	}, 20*time.Second, 100*time.Millisecond).Should(Equal("bob, manager oncall-tool"))
}

// TestTrimmedCacheCertifiesOnlyIdleNodes: with new-node certification on,
// a node running a workload pod is left in service and a node with only a
// DaemonSet pod is certified, judged from the trimmed pod cache.
func TestTrimmedCacheCertifiesOnlyIdleNodes(t *testing.T) {
	h := newHarness(t)
	g := h.g
	steps := []gpuhealthv1alpha1.SuiteStep{
		{Name: "dcgm", Job: gpuhealthv1alpha1.JobTemplate{Image: "dcgm"}, Parser: gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserDCGMDiag}},
	}
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Certification = gpuhealthv1alpha1.CertificationSpec{NewNodes: true, Steps: steps, MaxAttempts: 3, Backoff: dur("1m")}
	})
	busy := h.node("busy", nil)
	h.bulkyPod(busy.Name, h.label+"-trainer", nil)
	idle := h.node("idle", nil)
	h.bulkyPod(idle.Name, h.label+"-daemon", func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", UID: "0f6b1e2a-0000-4000-8000-000000000003"}}
	})
	startTrimmedManager(t, &fakeOutputs{out: map[string][]byte{}})

	g.Eventually(func() string { return h.status(idle.Name) }, 20*time.Second, 100*time.Millisecond).Should(HavePrefix("Certifying/"))
	g.Eventually(func() string {
		c := meta.FindStatusCondition(h.nodeHealth(busy.Name).Status.Conditions, gpuhealthv1alpha1.NodeHealthCertifiedCondition)
		if c == nil {
			return ""
		}
		return c.Reason
	}, 20*time.Second, 100*time.Millisecond).Should(Equal(gpuhealthv1alpha1.ReasonNotCertified))
	g.Expect(h.phase(busy.Name)).To(Equal(healthy))
	g.Expect(hasUncertifiedTaint(h.getNode(busy.Name))).To(BeFalse(), "a node with workloads is not taken out")
}
