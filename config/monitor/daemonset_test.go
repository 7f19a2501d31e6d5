package monitor_test

import (
	"context"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuhealth/gpuhealth/monitors/imex"
)

// The DaemonSet, as the apiserver stored it, runs the agent the way the
// admission policy and the node-side sources assume.
func TestDaemonSetRunsTheAgentAsThePolicyAssumes(t *testing.T) {
	g := NewWithT(t)
	ds := &appsv1.DaemonSet{}
	g.Expect(admin.Get(context.Background(), client.ObjectKey{Namespace: monitorNamespace, Name: monitorSA}, ds)).To(Succeed())
	pod := ds.Spec.Template.Spec

	// The policy knows the agent by its service account and its node by the
	// pod-bound token the kubelet mounts; a turned-off automount would leave
	// the agent with no token, and a Secret token would be refused.
	g.Expect(pod.ServiceAccountName).To(Equal(monitorSA))
	g.Expect(pod.AutomountServiceAccountToken).To(Or(BeNil(), HaveValue(BeTrue())))

	// It keeps running on quarantined and unreachable nodes.
	g.Expect(pod.Tolerations).To(ContainElement(corev1.Toleration{Operator: corev1.TolerationOpExists}))
	g.Expect(pod.NodeSelector).To(Equal(map[string]string{"nvidia.com/gpu.present": "true"}))

	g.Expect(pod.Containers).To(HaveLen(1))
	c := pod.Containers[0]
	g.Expect(c.Args).To(ContainElements("--node-name=$(NODE_NAME)", "--spool-dir=/var/lib/gpuhealth/spool"))
	g.Expect(c.Env).To(ContainElement(corev1.EnvVar{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "spec.nodeName"},
	}}))

	// Privileged only for the kernel log (the chart's monitor.kmsg.enabled,
	// on by default): the runtime's default device list has no /dev/kmsg.
	// Never a writable root, never a GPU.
	sc := c.SecurityContext
	g.Expect(sc).NotTo(BeNil())
	g.Expect(sc.Privileged).To(HaveValue(BeTrue()))
	g.Expect(sc.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()))
	g.Expect(c.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "kmsg", MountPath: "/dev/kmsg", ReadOnly: true}))
	g.Expect(c.Resources.Limits).NotTo(HaveKey(corev1.ResourceName("nvidia.com/gpu")))
	g.Expect(c.Args).To(ContainElement("--config=/etc/gpuhealth/monitor.yaml"))

	// nvidia-imex-ctl comes read-only from the host, where the imex source
	// looks for it (imex.DefaultCommandPaths): the GPU Operator's driver
	// root, whose mount may appear after the pod started, and /usr/bin.
	hostToContainer := corev1.MountPropagationHostToContainer
	g.Expect(c.VolumeMounts).To(ContainElements(
		corev1.VolumeMount{Name: "driver-root", MountPath: "/run/nvidia/driver", ReadOnly: true, MountPropagation: &hostToContainer},
		corev1.VolumeMount{Name: "host-usr-bin", MountPath: "/host/usr/bin", ReadOnly: true},
	))
	for _, p := range imex.DefaultCommandPaths {
		g.Expect(c.VolumeMounts).To(ContainElement(Satisfy(func(m corev1.VolumeMount) bool {
			return m.ReadOnly && strings.HasPrefix(p, m.MountPath+"/")
		})), "no read-only mount holds %s", p)
	}
	directoryOrCreate, directory := corev1.HostPathDirectoryOrCreate, corev1.HostPathDirectory
	g.Expect(pod.Volumes).To(ContainElements(
		// A node with a host-installed driver has no /run/nvidia/driver:
		// the pod must start anyway.
		corev1.Volume{Name: "driver-root", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/run/nvidia/driver", Type: &directoryOrCreate},
		}},
		corev1.Volume{Name: "host-usr-bin", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/usr/bin", Type: &directory},
		}},
	))
	// Every hostPath but the spool is mounted read-only.
	for _, m := range c.VolumeMounts {
		if m.Name != "spool" {
			g.Expect(m.ReadOnly).To(BeTrue(), "volume %s is mounted writable", m.Name)
		}
	}
}
