package cachetrim_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/cachetrim"
	"github.com/gpuhealth/gpuhealth/controllers/computedomain"
	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

const (
	jobNamespace    = "gpuhealth-system"
	driverNamespace = "nvidia-dra-driver-gpu"
	operator        = "gpuhealth-operator"
)

var (
	testScheme *runtime.Scheme
	k8sClient  client.Client
	testEnv    *envtest.Environment
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(e *testenv.Env) error {
		testScheme, k8sClient, testEnv = e.Scheme, e.Client, e.Environment
		for _, ns := range []string{jobNamespace, driverNamespace} {
			if err := k8sClient.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				return err
			}
		}
		return nil
	}))
}

// startCache starts an informer cache with the operator's options.
func startCache(t *testing.T) cache.Cache {
	t.Helper()
	opts := cachetrim.CacheOptions(jobNamespace, driverNamespace)
	opts.Scheme = testScheme
	c, err := cache.New(testEnv.Config, opts)
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		NewWithT(t).Expect(<-done).To(Succeed())
	})
	return c
}

// cached waits until the cache holds obj at the apiserver's version want
// and returns it.
func cached[T client.Object](t *testing.T, c cache.Cache, want T, obj T) T {
	t.Helper()
	NewWithT(t).Eventually(func() string {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(want), obj); err != nil {
			return err.Error()
		}
		return obj.GetResourceVersion()
	}, 10*time.Second, 20*time.Millisecond).Should(Equal(want.GetResourceVersion()))
	return obj
}

// bigPod is a workload pod with everything a real one carries.
func bigPod(name, node string) *corev1.Pod {
	container := func(name string) corev1.Container {
		return corev1.Container{
			Name: name, Image: "nvcr.io/nvidia/pytorch:25.01-py3", Command: []string{"torchrun"}, Args: []string{"--nproc-per-node=8", "train.py"},
			Env: []corev1.EnvVar{{Name: "NCCL_DEBUG", Value: "INFO"}, {Name: "MASTER_ADDR", Value: "trainer-0"}},
			Resources: corev1.ResourceRequirements{
				Limits:   corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")},
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("32"), corev1.ResourceMemory: resource.MustParse("512Gi")},
			},
			VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, {Name: "shm", MountPath: "/dev/shm"}},
			Ports:        []corev1.ContainerPort{{ContainerPort: 29500}},
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "default",
			Labels: map[string]string{"app": "trainer", "batch.kubernetes.io/job-name": "train"},
			Annotations: map[string]string{
				corev1.MirrorPodAnnotationKey:          "mirror",
				batchv1.JobCompletionIndexAnnotation:   "0",
				"kubectl.kubernetes.io/restartedAt":    "2026-12-01T00:00:00Z",
				"example.com/a-large-annotation-value": strings.Repeat("x", 4096),
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", UID: "0f6b1e2a-0000-4000-8000-000000000001"}},
		},
		Spec: corev1.PodSpec{
			NodeName:          node,
			InitContainers:    []corev1.Container{container("init")},
			Containers:        []corev1.Container{container("train"), container("sidecar")},
			Volumes:           []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}, {Name: "shm", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}}},
			Tolerations:       []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			PriorityClassName: "",
			NodeSelector:      map[string]string{"nvidia.com/gpu.present": "true"},
		},
	}
}

// TestPodsKeepWhatTheOperatorReads: a ComputeDomain daemon pod with a large
// spec and status round-trips through a cache with the operator's options;
// what is left is exactly what some controller reads. A workload pod is not
// cached at all, nor is a pod with the domain label outside the DRA
// driver's namespace.
func TestPodsKeepWhatTheOperatorReads(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	c := startCache(t)
	workload := bigPod("trainer-1", "trim-node-pod")
	g.Expect(k8sClient.Create(ctx, workload)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), workload, client.GracePeriodSeconds(0)) })
	lookAlike := bigPod("trainer-2", "trim-node-pod")
	lookAlike.Labels[computedomain.NodeLabel] = "0f6b1e2a-0000-4000-8000-00000000cd01"
	g.Expect(k8sClient.Create(ctx, lookAlike)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), lookAlike, client.GracePeriodSeconds(0)) })
	p := bigPod("trainer-0", "trim-node-pod")
	p.Namespace = driverNamespace
	p.Labels[computedomain.NodeLabel] = "0f6b1e2a-0000-4000-8000-00000000cd01"
	g.Expect(k8sClient.Create(ctx, p)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), p, client.GracePeriodSeconds(0)) })
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	p.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: "10.0.0.7", PodIPs: []corev1.PodIP{{IP: "10.0.0.7"}}, HostIP: "192.168.0.7",
		StartTime: &now, QOSClass: corev1.PodQOSBurstable, Message: "running", Reason: "Started",
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: "train", Ready: true, Image: "nvcr.io/nvidia/pytorch:25.01-py3", ImageID: "sha256:" + strings.Repeat("a", 64),
			ContainerID: "containerd://" + strings.Repeat("b", 64), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		}},
	}
	g.Expect(k8sClient.Status().Update(ctx, p)).To(Succeed())
	live := &corev1.Pod{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), live)).To(Succeed())
	g.Expect(live.ManagedFields).NotTo(BeEmpty())

	got := cached(t, c, live, &corev1.Pod{})
	pods := &corev1.PodList{}
	g.Expect(c.List(ctx, pods)).To(Succeed())
	g.Expect(pods.Items).To(HaveLen(1), "only the daemon pod is cached")
	g.Expect(pods.Items[0].Name).To(Equal(p.Name))
	g.Expect(pods.Items[0].Namespace).To(Equal(driverNamespace))
	g.Expect(got.Name).To(Equal(live.Name))
	g.Expect(got.Namespace).To(Equal(live.Namespace))
	g.Expect(got.UID).To(Equal(live.UID))
	g.Expect(got.Labels).To(Equal(live.Labels), "PodDisruptionBudget selectors, the Job kind and ComputeDomain labels")
	g.Expect(got.OwnerReferences).To(Equal(live.OwnerReferences), "DaemonSet pods")
	g.Expect(got.CreationTimestamp).To(Equal(live.CreationTimestamp))
	g.Expect(got.ManagedFields).To(BeNil())
	g.Expect(got.Annotations).To(Equal(map[string]string{corev1.MirrorPodAnnotationKey: "mirror", batchv1.JobCompletionIndexAnnotation: "0"}))
	g.Expect(got.Spec).To(Equal(corev1.PodSpec{NodeName: "trim-node-pod", Containers: []corev1.Container{{Name: "train"}, {Name: "sidecar"}}}))
	g.Expect(got.Status).To(Equal(corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7", Conditions: live.Status.Conditions}))

	// The pod index and a deletion still reach the cache.
	g.Expect(k8sClient.Delete(ctx, live)).To(Succeed())
	g.Eventually(func() bool {
		cur := &corev1.Pod{}
		return c.Get(ctx, client.ObjectKeyFromObject(live), cur) == nil && cur.DeletionTimestamp != nil
	}, 10*time.Second, 20*time.Millisecond).Should(BeTrue(), "the deletionTimestamp is kept")
}

// TestNodesKeepWhatTheOperatorReads: a Node's images, addresses and the rest
// of its nodeInfo go; its metadata, spec, conditions, capacity,
// allocatable and boot ID stay; its managedFields entries stay without
// fieldsV1, enough to name who uncordoned it.
func TestNodesKeepWhatTheOperatorReads(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	c := startCache(t)
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "trim-node",
			Labels:      map[string]string{"nvidia.com/gpu.present": "true", "nvidia.com/gpu.clique": "c1.0"},
			Annotations: map[string]string{nodepkg.AppliedAnnotation: "cordon,taint", "cluster.x-k8s.io/machine": "m-0"},
		},
		Spec: corev1.NodeSpec{
			Unschedulable: true, ProviderID: "aws:///us-east-1a/i-0123",
			Taints: []corev1.Taint{{Key: "gpuhealth.dev/quarantined", Effect: corev1.TaintEffectNoSchedule}},
		},
	}
	g.Expect(client.WithFieldOwner(k8sClient, operator).Create(ctx, n)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), n) })
	setNodeStatus(t, n)
	live := &corev1.Node{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(n), live)).To(Succeed())

	got := cached(t, c, live, &corev1.Node{})
	g.Expect(got.Labels).To(Equal(live.Labels))
	g.Expect(got.Annotations).To(Equal(live.Annotations))
	g.Expect(got.Spec).To(Equal(live.Spec))
	g.Expect(got.Status).To(Equal(corev1.NodeStatus{
		Capacity: live.Status.Capacity, Allocatable: live.Status.Allocatable,
		Conditions: live.Status.Conditions, NodeInfo: corev1.NodeSystemInfo{BootID: "boot-1"},
	}))
	g.Expect(got.ManagedFields).To(HaveLen(len(live.ManagedFields)))
	for i, e := range live.ManagedFields {
		g.Expect(e.FieldsV1).NotTo(BeNil())
		e.FieldsV1 = nil
		g.Expect(got.ManagedFields[i]).To(Equal(e))
	}

	// Someone else uncordons it with a write that leaves an entry: the
	// cached copy names them as the apiserver's does.
	time.Sleep(time.Until(live.ManagedFields[0].Time.Add(1100 * time.Millisecond)))
	live.Spec.Unschedulable = false
	live.Labels["team"] = "infra"
	g.Expect(client.WithFieldOwner(k8sClient, "node-admin-tool").Update(ctx, live)).To(Succeed())
	got = cached(t, c, live, &corev1.Node{})
	g.Expect(nodepkg.UncordonedBy(got, operator)).To(HavePrefix("manager node-admin-tool (Update at "))
	g.Expect(nodepkg.UncordonedBy(got, operator)).To(Equal(nodepkg.UncordonedBy(live, operator)))
}

// setNodeStatus writes what a kubelet reports, images and all.
func setNodeStatus(t *testing.T, n *corev1.Node) {
	t.Helper()
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	gpus := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8"), corev1.ResourceCPU: resource.MustParse("192")}
	n.Status = corev1.NodeStatus{
		Capacity: gpus, Allocatable: gpus,
		Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now},
			{Type: gpuhealthv1alpha1.GPUHealthyNodeCondition, Status: corev1.ConditionFalse, Reason: "XID", LastHeartbeatTime: now, LastTransitionTime: now},
		},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.7"}, {Type: corev1.NodeHostName, Address: n.Name}},
		NodeInfo: corev1.NodeSystemInfo{
			BootID: "boot-1", MachineID: "m", SystemUUID: "s", KernelVersion: "6.8.0", OSImage: "Ubuntu 24.04",
			ContainerRuntimeVersion: "containerd://2.1", KubeletVersion: "v1.37.2", OperatingSystem: "linux", Architecture: "amd64",
		},
		Images: []corev1.ContainerImage{
			{Names: []string{"nvcr.io/nvidia/pytorch@sha256:" + strings.Repeat("c", 64), "nvcr.io/nvidia/pytorch:25.01-py3"}, SizeBytes: 20 << 30},
			{Names: []string{"nvcr.io/nvidia/k8s/dcgm-exporter:4.2"}, SizeBytes: 1 << 30},
		},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
	}
	NewWithT(t).Expect(client.WithFieldOwner(k8sClient, "kubelet").Status().Update(context.Background(), n)).To(Succeed())
}

// TestPatchesFromTrimmedNodesKeepWhatTheCacheDropped: the operator's node
// writes, made on a cached copy, change only what they mean to; images,
// addresses and the rest of nodeInfo stay on the apiserver's object.
func TestPatchesFromTrimmedNodesKeepWhatTheCacheDropped(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	c := startCache(t)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "trim-node-writes", Labels: map[string]string{"nvidia.com/gpu.present": "true"}}}
	g.Expect(k8sClient.Create(ctx, n)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), n) })
	setNodeStatus(t, n)
	before := &corev1.Node{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(n), before)).To(Succeed())
	w := client.WithFieldOwner(k8sClient, operator)

	node := cached(t, c, before, &corev1.Node{})
	taint := &corev1.Taint{Key: "gpuhealth.dev/quarantined", Effect: corev1.TaintEffectNoSchedule}
	g.Expect(nodepkg.Quarantine(ctx, w, node, true, taint, "Quarantined")).To(Succeed())
	node = cached(t, c, node, &corev1.Node{})
	g.Expect(nodepkg.SetGPUHealthy(ctx, w, node, corev1.ConditionFalse, "XID79", "GPU fell off the bus", metav1.Now())).To(Succeed())
	node = cached(t, c, node, &corev1.Node{})
	_, err := nodepkg.TaintFabric(ctx, w, node, "c1.0", time.Now())
	g.Expect(err).NotTo(HaveOccurred())
	node = cached(t, c, node, &corev1.Node{})
	g.Expect(nodepkg.Release(ctx, w, node, []corev1.Taint{*taint})).To(Succeed())

	after := &corev1.Node{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(n), after)).To(Succeed())
	g.Expect(after.Status.Images).To(Equal(before.Status.Images))
	g.Expect(after.Status.Addresses).To(Equal(before.Status.Addresses))
	g.Expect(after.Status.NodeInfo).To(Equal(before.Status.NodeInfo))
	g.Expect(after.Status.DaemonEndpoints).To(Equal(before.Status.DaemonEndpoints))
	g.Expect(after.Status.Conditions).To(HaveLen(2), "Ready kept beside GPUHealthy")
	g.Expect(after.Status.Conditions[0]).To(Equal(before.Status.Conditions[0]))
	g.Expect(after.Spec.Unschedulable).To(BeFalse())
	g.Expect(after.Spec.Taints).To(ContainElement(HaveField("Key", gpuhealthv1alpha1.FabricDegradedTaintKey)))
	g.Expect(after.Spec.Taints).NotTo(ContainElement(HaveField("Key", taint.Key)))
	g.Expect(after.Spec.Taints).To(HaveLen(len(before.Spec.Taints)+1), "the apiserver's not-ready taint kept")
}

// TestManagedFieldsStayOutOfTheCache: every other kind is cached without
// managedFields; a NodeHealth keeps only its main resource's entries, which
// name who wrote a manual request; Jobs are cached in the operator's
// namespace only.
func TestManagedFieldsStayOutOfTheCache(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	c := startCache(t)

	nh := &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: "trim-nodehealth"}}
	g.Expect(client.WithFieldOwner(k8sClient, operator).Create(ctx, nh)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), nh) })
	nh.Status.Phase = gpuhealthv1alpha1.PhaseHealthy
	g.Expect(client.WithFieldOwner(k8sClient, operator).Status().Update(ctx, nh)).To(Succeed())
	nh.Spec.Request = &gpuhealthv1alpha1.ManualRequest{Action: gpuhealthv1alpha1.RequestRecertify, ID: "t-1"}
	g.Expect(client.WithFieldOwner(k8sClient, "oncall-tool").Update(ctx, nh)).To(Succeed())
	live := &gpuhealthv1alpha1.NodeHealth{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(nh), live)).To(Succeed())
	var main []metav1.ManagedFieldsEntry
	for _, e := range live.ManagedFields {
		if e.Subresource == "" {
			main = append(main, e)
		}
	}
	g.Expect(live.ManagedFields).To(ContainElement(HaveField("Subresource", "status")))
	g.Expect(main).To(ContainElement(And(HaveField("Manager", "oncall-tool"), HaveField("FieldsV1", WithTransform((*metav1.FieldsV1).GetRawString, ContainSubstring(`"f:request"`))))))
	got := cached(t, c, live, &gpuhealthv1alpha1.NodeHealth{})
	g.Expect(got.ManagedFields).To(Equal(main))
	want := live.DeepCopy()
	want.TypeMeta, want.ManagedFields = got.TypeMeta, main
	g.Expect(got).To(Equal(want), "nothing else is trimmed")

	ev := &gpuhealthv1alpha1.NodeHealthEvent{Spec: gpuhealthv1alpha1.NodeHealthEventSpec{
		NodeName: "trim-node", Source: gpuhealthv1alpha1.SourceNVML, Check: gpuhealthv1alpha1.CheckXID, Code: "79",
		Severity: gpuhealthv1alpha1.SeverityFatal, Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "GPU-0"}, Message: "m",
	}}
	ev.Name = ev.Spec.EventName()
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "trim-job", Namespace: jobNamespace},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "i"}},
		}}},
	}
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "trim-pdb", Namespace: "default"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{}},
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "trim-ns", Labels: map[string]string{"drain": "wait"}}}
	for _, o := range []client.Object{ev, j, pdb, ns} {
		g.Expect(k8sClient.Create(ctx, o)).To(Succeed())
		t.Cleanup(func() {
			_ = k8sClient.Delete(context.Background(), o, client.PropagationPolicy(metav1.DeletePropagationBackground))
		})
		g.Expect(o.GetManagedFields()).NotTo(BeEmpty())
		got := cached(t, c, o, o.DeepCopyObject().(client.Object))
		g.Expect(got.GetManagedFields()).To(BeNil(), "%T", o)
	}

	other := &batchv1.Job{}
	err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "trim-job"}, other)
	g.Expect(err).To(HaveOccurred(), "Jobs are cached in %s only", jobNamespace)
}

// TestTransformsAreIdempotentAndTypeSafe: an informer may pass an object
// through its transform again, and a tombstone or another kind through as is.
func TestTransformsAreIdempotentAndTypeSafe(t *testing.T) {
	g := NewWithT(t)
	p := bigPod("p", "n")
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "m"}}
	once, err := cachetrim.TrimPod(p)
	g.Expect(err).NotTo(HaveOccurred())
	twice, err := cachetrim.TrimPod(once.(*corev1.Pod).DeepCopy())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(twice).To(Equal(once))

	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m", FieldsV1: metav1.NewFieldsV1(`{}`)}}}}
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"i"}}}
	once, err = cachetrim.TrimNode(n)
	g.Expect(err).NotTo(HaveOccurred())
	twice, err = cachetrim.TrimNode(once.(*corev1.Node).DeepCopy())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(twice).To(Equal(once))

	for _, f := range []func(any) (any, error){cachetrim.TrimPod, cachetrim.TrimNode, cachetrim.TrimNodeHealth} {
		other := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "j"}}
		out, err := f(other)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(out).To(BeIdenticalTo(other))
	}
}
