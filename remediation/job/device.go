package job

import (
	"strconv"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceclaimtemplates,verbs=create;deletecollection,namespace=gpuhealth-system

// GPUUUIDEnv is the variable a per-GPU Job's container finds its GPU's
// UUID in, for a command such as nvidia-smi -r -i $(GPUHEALTH_GPU_UUID).
const GPUUUIDEnv = "GPUHEALTH_GPU_UUID"

// The health taints NVIDIA's DRA driver puts on its own devices.
const (
	DriverXIDTaint     = "gpu.nvidia.com/xid"
	DriverGPULostTaint = "gpu.nvidia.com/gpu-lost"
)

// claimName is the pod's name for the claim of its one GPU.
const claimName = "gpu"

// Device is the one GPU a per-GPU Job runs on.
type Device struct {
	// Node is the GPU's node; Name its device name in the driver's
	// ResourceSlice (gpu-3); UUID its UUID; Driver the DRA driver.
	Node, Name, UUID, Driver string
	// Class is the DeviceClass the claim asks for.
	Class string
	// TaintKey is the quarantine's device taint, which the claim tolerates.
	TaintKey string
}

// DeviceName is the deterministic name of a per-GPU Job (and of its
// ResourceClaimTemplate): the kind, the node and device, the attempt and a
// hash of when the attempt started, like Name.
func DeviceName(kind Kind, d Device, attempt int32, started time.Time) string {
	return Name(kind, d.Node+"-"+d.Name, attempt, started)
}

// BuildDevice returns the Job of a kind for one GPU: Build's Job, whose
// pod claims exactly that GPU through the ResourceClaimTemplate of the
// same name (DeviceClaimTemplate), and finds its UUID in GPUUUIDEnv. The
// allocation pins the pod to the GPU's node; Build's node affinity says so
// too.
func BuildDevice(kind Kind, d Device, namespace string, attempt int32, started time.Time, tmpl gpuhealthv1alpha1.JobTemplate, timeout time.Duration, env Env) *batchv1.Job {
	name := DeviceName(kind, d, attempt, started)
	ours := map[string]string{NodeLabel: d.Node, KindLabel: string(kind), AttemptLabel: strconv.Itoa(int(attempt)), DeviceLabel: d.Name}
	affinity := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: onNodes(d.Node)},
	}}
	tmpl.Env = append([]corev1.EnvVar{{Name: GPUUUIDEnv, Value: d.UUID}}, tmpl.Env...)
	j := build(name, namespace, kind, ours, started.UTC().Format(time.RFC3339), tmpl, affinity, timeout, env)
	pod := &j.Spec.Template.Spec
	pod.ResourceClaims = []corev1.PodResourceClaim{{Name: claimName, ResourceClaimTemplateName: &name}}
	pod.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: claimName}}
	return j
}

// DeviceClaimTemplate is the ResourceClaimTemplate a per-GPU Job's pod
// claims its GPU through: one device of the class whose uuid attribute,
// in the driver's domain, is the GPU's (a CEL selector; the UUID is a
// quoted literal of the characters a finding's component id allows),
// tolerating the quarantine's taint with each effect spelled out — the
// eviction controller honours only a toleration whose effect is NoExecute —
// and the health taints NVIDIA's driver puts on a GPU itself (NoSchedule,
// which it never lifts until its plugin restarts), so that the GPU it
// tainted can be tested at all.
func DeviceClaimTemplate(kind Kind, d Device, namespace string, attempt int32, started time.Time) *resourcev1.ResourceClaimTemplate {
	name := DeviceName(kind, d, attempt, started)
	tolerate := func(effect resourcev1.DeviceTaintEffect) resourcev1.DeviceToleration {
		return resourcev1.DeviceToleration{Key: d.TaintKey, Operator: resourcev1.DeviceTolerationOpExists, Effect: effect}
	}
	return &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace,
			Labels: map[string]string{NodeLabel: d.Node, KindLabel: string(kind), DeviceLabel: d.Name}},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: claimName, Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: d.Class,
				Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
					Expression: "device.attributes[" + strconv.Quote(d.Driver) + "].uuid == " + strconv.Quote(d.UUID),
				}}},
				Tolerations: []resourcev1.DeviceToleration{tolerate(resourcev1.DeviceTaintEffectNoSchedule), tolerate(resourcev1.DeviceTaintEffectNoExecute),
					{Key: DriverXIDTaint, Operator: resourcev1.DeviceTolerationOpExists, Effect: resourcev1.DeviceTaintEffectNoSchedule},
					{Key: DriverGPULostTaint, Operator: resourcev1.DeviceTolerationOpExists, Effect: resourcev1.DeviceTaintEffectNoSchedule}},
			}}},
		}}},
	}
}
