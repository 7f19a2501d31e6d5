package computedomain

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultDriverNamespace is where NVIDIA's DRA driver's Helm chart installs
// the driver, and with it the ComputeDomain daemon DaemonSets and pods.
const DefaultDriverNamespace = "nvidia-dra-driver-gpu"

// IsDaemonPod reports whether pod is a ComputeDomain daemon pod: it runs in
// driverNamespace (the DRA driver's), carries the domain's NodeLabel and is
// controlled by an apps/v1 DaemonSet, which is how the driver runs one
// daemon per domain and node. An empty driverNamespace matches no pod.
//
// The label alone proves nothing: anyone who may create pods, in any
// namespace, can set it, and a pod taken for a daemon keeps its node a
// member of the domain (a drained node then never leaves it, holding a
// budget slot) and may be deleted as a dead member's stale daemon. Only the
// driver and the cluster's administrators create DaemonSets and pods in the
// driver's namespace, so the namespace is what the decision rests on; the
// DaemonSet need not be read.
func IsDaemonPod(pod *corev1.Pod, driverNamespace string) bool {
	if driverNamespace == "" || pod.Namespace != driverNamespace || pod.Labels[NodeLabel] == "" {
		return false
	}
	ref := metav1.GetControllerOf(pod)
	return ref != nil && ref.Kind == "DaemonSet" && ref.APIVersion == "apps/v1"
}
