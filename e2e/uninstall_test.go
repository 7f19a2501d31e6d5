//go:build e2e

package e2e

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
)

// TestHelmUpgradeAndUninstall runs last (it removes the installation):
// helm upgrade with a changed value rolls the operator's Deployment, adopts
// the default policy (a post-install hook on the first install) into the
// release, and keeps every NodeHealth and finding; helm uninstall leaves
// nothing of gpuhealth but its CRDs, their objects (the NodeHealths) and
// the policy.
func TestHelmUpgradeAndUninstall(t *testing.T) {
	g := NewWithT(t)
	c := env.Cluster.Client
	var nhs gpuhealthv1alpha1.NodeHealthList
	g.Expect(c.List(ctx, &nhs)).To(Succeed())
	g.Expect(nhs.Items).NotTo(BeEmpty())
	deployment := func(g Gomega) *appsv1.Deployment {
		d := &appsv1.Deployment{}
		g.Expect(c.Get(ctx, client.ObjectKey{Namespace: framework.Namespace, Name: "gpuhealth-operator"}, d)).To(Succeed())
		return d
	}
	before := deployment(g)

	start := time.Now()
	_, err := env.Cluster.Helm(ctx, "upgrade", framework.ReleaseName, "charts/gpuhealth", "--namespace", framework.Namespace,
		"-f", "charts/gpuhealth/values-remediation.yaml", "--set", "operator.replicas=0", "--set", "operator.workers=8", "--wait", "--timeout", "2m")
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("helm upgrade took %s", time.Since(start).Round(time.Millisecond))
	after := deployment(g)
	g.Expect(after.Generation).To(BeNumerically(">", before.Generation), "the changed value rolls the Deployment")
	g.Expect(after.Spec.Template.Spec.Containers[0].Args).To(ContainElement("--workers=8"))
	g.Eventually(func(g Gomega) int64 { return deployment(g).Status.ObservedGeneration }).Should(Equal(after.Generation))
	manifest, err := env.Cluster.Helm(ctx, "get", "manifest", framework.ReleaseName, "--namespace", framework.Namespace)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(manifest).To(ContainSubstring("kind: RemediationPolicy"), "the upgrade adopted the default policy into the release")
	var nhsAfter gpuhealthv1alpha1.NodeHealthList
	g.Expect(c.List(ctx, &nhsAfter)).To(Succeed())
	g.Expect(nhsAfter.Items).To(HaveLen(len(nhs.Items)), "the upgrade keeps every NodeHealth")

	start = time.Now()
	_, err = env.Cluster.Helm(ctx, "uninstall", framework.ReleaseName, "--namespace", framework.Namespace, "--wait", "--timeout", "2m")
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("helm uninstall took %s", time.Since(start).Round(time.Millisecond))

	// Nothing of ours is left but the CRDs, their objects and the policy.
	gone := func(obj client.Object, namespace, name string) {
		err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, obj)
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%T %s/%s is left: %v", obj, namespace, name, err)
	}
	for _, name := range []string{"gpuhealth-operator", "gpuhealth-monitor"} {
		gone(&corev1.ServiceAccount{}, framework.Namespace, name)
		gone(&rbacv1.ClusterRole{}, "", name)
		gone(&rbacv1.ClusterRoleBinding{}, "", name)
	}
	gone(&appsv1.Deployment{}, framework.Namespace, "gpuhealth-operator")
	gone(&appsv1.DaemonSet{}, framework.Namespace, "gpuhealth-monitor")
	gone(&corev1.ConfigMap{}, framework.Namespace, "gpuhealth-monitor")
	gone(&rbacv1.Role{}, framework.Namespace, "gpuhealth-operator")
	gone(&admissionregistrationv1.ValidatingAdmissionPolicy{}, "", "gpuhealth-monitor-own-node")
	gone(&admissionregistrationv1.ValidatingAdmissionPolicyBinding{}, "", "gpuhealth-monitor-own-node")
	for _, crd := range []string{"nodehealthevents", "nodehealths", "remediationpolicies"} {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
		g.Expect(c.Get(ctx, client.ObjectKey{Name: crd + ".gpuhealth.dev"}, u)).To(Succeed(), "the CRD %s stays", crd)
		g.Expect(u.GetDeletionTimestamp()).To(BeNil())
	}
	g.Expect(c.Get(ctx, client.ObjectKey{Name: "default"}, &gpuhealthv1alpha1.RemediationPolicy{})).To(Succeed(), "the policy stays")
	g.Expect(c.List(ctx, &nhsAfter)).To(Succeed())
	g.Expect(nhsAfter.Items).To(HaveLen(len(nhs.Items)), "every NodeHealth stays")
}
