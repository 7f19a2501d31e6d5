package charts_test

import (
	"context"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestUserRolesGrantWhatTheyDocument applies the chart's ClusterRoles for
// people to a real apiserver, binds a user to each, and asks the
// apiserver's authorizer (SubjectAccessReview) what each may do; only
// gpuhealth-view is aggregated into the built-in roles.
func TestUserRolesGrantWhatTheyDocument(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	objs := render(t)
	for _, name := range []string{"gpuhealth-view", "gpuhealth-request", "gpuhealth-policy-admin"} {
		u := find(objs, "ClusterRole", name)
		g.Expect(u).NotTo(BeNil(), name)
		var aggregated []string
		for k, v := range u.GetLabels() {
			if strings.HasPrefix(k, "rbac.authorization.k8s.io/aggregate-to-") && v == "true" {
				aggregated = append(aggregated, strings.TrimPrefix(k, "rbac.authorization.k8s.io/aggregate-to-"))
			}
		}
		if name == "gpuhealth-view" {
			g.Expect(aggregated).To(ConsistOf("view"), "view is aggregated into the built-in view role")
		} else {
			g.Expect(aggregated).To(BeEmpty(), "%s is bound on purpose, never aggregated", name)
		}
		o := u.DeepCopy()
		o.SetResourceVersion("")
		g.Expect(env.Client.Create(ctx, o)).To(Succeed())
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-test"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name + "-user"}},
		}
		g.Expect(env.Client.Create(ctx, crb)).To(Succeed())
		t.Cleanup(func() {
			_ = env.Client.Delete(context.Background(), crb)
			_ = env.Client.Delete(context.Background(), o)
		})
	}

	type attrs = authorizationv1.ResourceAttributes
	const group = "gpuhealth.dev"
	cases := []struct {
		name    string
		role    string
		attrs   attrs
		allowed bool
	}{
		{"a viewer lists NodeHealths", "gpuhealth-view", attrs{Group: group, Resource: "nodehealths", Verb: "list"}, true},
		{"a viewer watches findings", "gpuhealth-view", attrs{Group: group, Resource: "nodehealthevents", Verb: "watch"}, true},
		{"a viewer reads a policy", "gpuhealth-view", attrs{Group: group, Resource: "remediationpolicies", Verb: "get"}, true},
		{"a viewer lists NodeInventories (kubectl gpuhealth status's drift)", "gpuhealth-view", attrs{Group: group, Resource: "nodeinventories", Verb: "list"}, true},
		{"a viewer may not write a NodeInventory", "gpuhealth-view", attrs{Group: group, Resource: "nodeinventories", Verb: "update"}, false},
		{"a viewer may not request anything", "gpuhealth-view", attrs{Group: group, Resource: "nodehealths", Verb: "patch"}, false},
		{"a viewer may not change a policy", "gpuhealth-view", attrs{Group: group, Resource: "remediationpolicies", Verb: "patch"}, false},
		{"a requester patches a NodeHealth's spec", "gpuhealth-request", attrs{Group: group, Resource: "nodehealths", Verb: "patch"}, true},
		{"a requester reads NodeHealths", "gpuhealth-request", attrs{Group: group, Resource: "nodehealths", Verb: "list"}, true},
		{"a requester may not update a NodeHealth", "gpuhealth-request", attrs{Group: group, Resource: "nodehealths", Verb: "update"}, false},
		{"a requester may not write a NodeHealth's status", "gpuhealth-request", attrs{Group: group, Resource: "nodehealths", Subresource: "status", Verb: "patch"}, false},
		{"a requester may not delete a NodeHealth", "gpuhealth-request", attrs{Group: group, Resource: "nodehealths", Verb: "delete"}, false},
		{"a requester may not touch findings", "gpuhealth-request", attrs{Group: group, Resource: "nodehealthevents", Verb: "patch"}, false},
		{"a requester may not change a policy", "gpuhealth-request", attrs{Group: group, Resource: "remediationpolicies", Verb: "patch"}, false},
		{"a requester may not cordon a node itself", "gpuhealth-request", attrs{Resource: "nodes", Verb: "patch"}, false},
		{"a policy admin creates a policy", "gpuhealth-policy-admin", attrs{Group: group, Resource: "remediationpolicies", Verb: "create"}, true},
		{"a policy admin deletes a policy", "gpuhealth-policy-admin", attrs{Group: group, Resource: "remediationpolicies", Verb: "delete"}, true},
		{"a policy admin patches a policy (the breaker's reset)", "gpuhealth-policy-admin", attrs{Group: group, Resource: "remediationpolicies", Verb: "patch"}, true},
		{"a policy admin may not write a policy's status", "gpuhealth-policy-admin", attrs{Group: group, Resource: "remediationpolicies", Subresource: "status", Verb: "update"}, false},
		{"a policy admin may not request anything", "gpuhealth-policy-admin", attrs{Group: group, Resource: "nodehealths", Verb: "patch"}, false},
		{"a policy admin may not touch findings", "gpuhealth-policy-admin", attrs{Group: group, Resource: "nodehealthevents", Verb: "delete"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			a := tc.attrs
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: tc.role + "-user", ResourceAttributes: &a}}
			g.Expect(env.Client.Create(ctx, sar)).To(Succeed())
			g.Expect(sar.Status.Allowed).To(Equal(tc.allowed), "reason: %q", sar.Status.Reason)
		})
	}
}
