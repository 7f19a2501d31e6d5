package computedomain

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestIsDaemonPod(t *testing.T) {
	const ns = "nvidia-dra-driver-gpu"
	owner := func(apiVersion, kind string, controller bool) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: "o", UID: "u", Controller: ptr.To(controller)}
	}
	pod := func(namespace string, labels map[string]string, owners ...metav1.OwnerReference) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "p", Labels: labels, OwnerReferences: owners}}
	}
	domain := map[string]string{NodeLabel: "0f6b1e2a-0000-4000-8000-00000000cd01"}
	cases := []struct {
		name            string
		pod             *corev1.Pod
		driverNamespace string
		want            bool
	}{
		{name: "The driver's DaemonSet pod with the domain label is a daemon pod.",
			pod: pod(ns, domain, owner("apps/v1", "DaemonSet", true)), driverNamespace: ns, want: true},
		{name: "A DaemonSet pod with the label in another namespace is not.",
			pod: pod("team-a", domain, owner("apps/v1", "DaemonSet", true)), driverNamespace: ns},
		{name: "A pod in the driver's namespace without the label is not.",
			pod: pod(ns, nil, owner("apps/v1", "DaemonSet", true)), driverNamespace: ns},
		{name: "A pod with an empty domain label is not.",
			pod: pod(ns, map[string]string{NodeLabel: ""}, owner("apps/v1", "DaemonSet", true)), driverNamespace: ns},
		{name: "A bare pod in the driver's namespace is not.",
			pod: pod(ns, domain), driverNamespace: ns},
		{name: "A pod a DaemonSet owns without controlling is not.",
			pod: pod(ns, domain, owner("apps/v1", "DaemonSet", false)), driverNamespace: ns},
		{name: "A pod a ReplicaSet controls is not.",
			pod: pod(ns, domain, owner("apps/v1", "ReplicaSet", true)), driverNamespace: ns},
		{name: "A pod another API group's DaemonSet controls is not.",
			pod: pod(ns, domain, owner("apps.kruise.io/v1alpha1", "DaemonSet", true)), driverNamespace: ns},
		{name: "Without a driver namespace no pod is.",
			pod: pod("", domain, owner("apps/v1", "DaemonSet", true)), driverNamespace: ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			NewWithT(t).Expect(IsDaemonPod(tc.pod, tc.driverNamespace)).To(Equal(tc.want))
		})
	}
}
