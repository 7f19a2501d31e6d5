package charts_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// TestHandOffActsOnlyAsItsServiceAccount installs the everything
// profile's operator RBAC for real and asks the apiserver, as the
// operator's service account: operator.handOff's rules are the
// gpuhealth-handoff service account's, not the operator's; the operator
// may impersonate that service account and no other identity; and as it,
// may do what the rules grant and nothing more.
func TestHandOffActsOnlyAsItsServiceAccount(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	const ns = "gpuhealth-system"
	g.Expect(client.IgnoreAlreadyExists(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))).To(Succeed())
	rbacKinds := []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
	n := 0
	for _, o := range render(t, "-f", "testdata/values-everything.yaml") {
		ours := strings.HasPrefix(o.GetName(), "gpuhealth-operator") || strings.HasPrefix(o.GetName(), "gpuhealth-handoff")
		if !ours || !slices.Contains(rbacKinds, o.GetKind()) {
			continue
		}
		g.Expect(env.Client.Create(ctx, o)).To(Succeed(), "%s %s", o.GetKind(), o.GetName())
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), o) })
		n++
	}
	g.Expect(n).To(BeNumerically(">=", 9), "the operator's and the hand-off's RBAC")

	operator, err := env.Environment.AddUser(envtest.User{
		Name:   "system:serviceaccount:" + ns + ":gpuhealth-operator",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	as := func(impersonate string) client.Client {
		cfg := rest.CopyConfig(operator.Config())
		cfg.Impersonate = rest.ImpersonationConfig{UserName: impersonate}
		c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
		g.Expect(err).NotTo(HaveOccurred())
		return c
	}
	// may asks whether c's identity may verb the resource in namespace
	// infra; the error is the apiserver's answer to the question itself.
	may := func(c client.Client, verb, group, resource string) (bool, error) {
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: "infra", Verb: verb, Group: group, Resource: resource,
		}}}
		err := c.Create(ctx, review)
		return review.Status.Allowed, err
	}
	asOperator, asHandOff := as(""), as("system:serviceaccount:"+ns+":gpuhealth-handoff")

	// The RBAC authorizer learns of new bindings from a watch.
	g.Eventually(func() (bool, error) { return may(asHandOff, "create", "repair.example.com", "repairrequests") }).
		WithTimeout(20*time.Second).Should(BeTrue(), "the hand-off creates what operator.handOff.rules grant")
	for _, tc := range []struct {
		who      string
		c        client.Client
		verb     string
		group    string
		resource string
		allowed  bool
	}{
		{"the hand-off", asHandOff, "delete", "repair.example.com", "repairrequests", true},
		{"the hand-off", asHandOff, "patch", "cluster.x-k8s.io", "machines", true},
		{"the hand-off", asHandOff, "create", "batch", "jobs", false},
		{"the hand-off", asHandOff, "patch", "", "nodes", false},
		{"the hand-off", asHandOff, "create", "repair.example.com", "repairtickets", false},
		{"the operator", asOperator, "create", "repair.example.com", "repairrequests", false},
		{"the operator", asOperator, "patch", "cluster.x-k8s.io", "machines", false},
	} {
		allowed, err := may(tc.c, tc.verb, tc.group, tc.resource)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(allowed).To(Equal(tc.allowed), "%s may %s %s.%s", tc.who, tc.verb, tc.resource, tc.group)
	}
	for _, other := range []string{"system:serviceaccount:" + ns + ":default", "system:serviceaccount:" + ns + ":gpuhealth-monitor", "admin"} {
		_, err := may(as(other), "get", "", "pods")
		g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "the operator may not impersonate %s: %v", other, err)
	}
}
