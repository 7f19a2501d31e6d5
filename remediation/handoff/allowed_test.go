package handoff

import (
	"errors"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// testMapper serves the kinds the cases use, with their usual resources.
func testMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper(nil)
	for _, k := range []struct {
		gvk   schema.GroupVersionKind
		scope meta.RESTScope
	}{
		{schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, meta.RESTScopeNamespace},
		{schema.GroupVersionKind{Group: "batch", Version: "v1", Kind: "Job"}, meta.RESTScopeNamespace},
		{schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, meta.RESTScopeNamespace},
		{schema.GroupVersionKind{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRoleBinding"}, meta.RESTScopeRoot},
		{schema.GroupVersionKind{Group: "gpuhealth.dev", Version: "v1alpha1", Kind: "NodeHealthEvent"}, meta.RESTScopeRoot},
		{schema.GroupVersionKind{Group: "repair.example.com", Version: "v1", Kind: "RepairRequest"}, meta.RESTScopeNamespace},
		{schema.GroupVersionKind{Group: "repair.example.com", Version: "v1", Kind: "RepairTicket"}, meta.RESTScopeNamespace},
		{schema.GroupVersionKind{Group: "fleet.example.com", Version: "v1", Kind: "HostRetirement"}, meta.RESTScopeRoot},
	} {
		m.Add(k.gvk, k.scope)
	}
	return m
}

func object(apiVersion, kind, namespace string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	u.SetNamespace(namespace)
	u.SetName("repair-gpu-7")
	return u
}

func TestPermit(t *testing.T) {
	// Everything the cases create is on the list, so that only the
	// refused groups and the namespace refuse them.
	everything := Allowed{Namespace: "gpuhealth-system", Resources: []schema.GroupResource{
		{Resource: "configmaps"}, {Group: "batch", Resource: "jobs"}, {Group: "apps", Resource: "deployments"},
		{Group: "rbac.authorization.k8s.io", Resource: "clusterrolebindings"}, {Group: "gpuhealth.dev", Resource: "nodehealthevents"},
		{Group: "repair.example.com", Resource: "repairrequests"}, {Group: "fleet.example.com", Resource: "hostretirements"},
	}}
	for _, tc := range []struct {
		name    string
		allowed Allowed
		want    *unstructured.Unstructured
		refused string
	}{
		{name: "a listed repair request in another namespace is permitted", allowed: everything, want: object("repair.example.com/v1", "RepairRequest", "infra")},
		{name: "a listed cluster-scoped kind is permitted", allowed: everything, want: object("fleet.example.com/v1", "HostRetirement", "")},
		{name: "a Job is refused even when listed", allowed: everything, want: object("batch/v1", "Job", "infra"), refused: `API group "batch"`},
		{name: "a ConfigMap (core group) is refused even when listed", allowed: everything, want: object("v1", "ConfigMap", "infra"), refused: `API group ""`},
		{name: "a Deployment is refused even when listed", allowed: everything, want: object("apps/v1", "Deployment", "infra"), refused: `API group "apps"`},
		{name: "a ClusterRoleBinding is refused even when listed", allowed: everything, want: object("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", ""), refused: `API group "rbac.authorization.k8s.io"`},
		{name: "a NodeHealthEvent is refused even when listed", allowed: everything, want: object("gpuhealth.dev/v1alpha1", "NodeHealthEvent", ""), refused: `API group "gpuhealth.dev"`},
		{name: "a kind of a listed group whose resource is not listed is refused", allowed: everything, want: object("repair.example.com/v1", "RepairTicket", "infra"),
			refused: "resource repairtickets.repair.example.com is not among those the install allows"},
		{name: "nothing is permitted when the install lists nothing", allowed: Allowed{Namespace: "gpuhealth-system"}, want: object("repair.example.com/v1", "RepairRequest", "infra"),
			refused: "allowed: none"},
		{name: "a listed kind in the operator's namespace is refused", allowed: everything, want: object("repair.example.com/v1", "RepairRequest", "gpuhealth-system"),
			refused: "operator's namespace gpuhealth-system"},
		{name: "a listed namespaced kind without a namespace is refused", allowed: everything, want: object("repair.example.com/v1", "RepairRequest", ""),
			refused: "sets no metadata.namespace"},
		{name: "a kind that is not served is refused", allowed: everything, want: object("repair.example.com/v2", "RepairRequest", "infra"),
			refused: "does not serve"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			err := tc.allowed.Permit(testMapper(), tc.want)
			if tc.refused == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(errors.Is(err, ErrPermanent)).To(BeTrue(), "%v", err)
			g.Expect(err).To(MatchError(ContainSubstring(tc.refused)))
		})
	}
}

func TestParseResources(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []schema.GroupResource
		err  string
	}{
		{name: "empty is nothing", in: ""},
		{name: "resource.group as kubectl writes it, duplicates once, blanks skipped", in: "repairrequests.repair.example.com, ,hostretirements.fleet.example.com,repairrequests.repair.example.com",
			want: []schema.GroupResource{{Group: "repair.example.com", Resource: "repairrequests"}, {Group: "fleet.example.com", Resource: "hostretirements"}}},
		{name: "a bare resource is of the core group", in: "configmaps", want: []schema.GroupResource{{Resource: "configmaps"}}},
		{name: "a wildcard resource is refused", in: "*.repair.example.com", err: "wildcards"},
		{name: "a wildcard group is refused", in: "repairrequests.*", err: "wildcards"},
		{name: "a subresource is refused", in: "repairrequests/status.repair.example.com", err: "subresources"},
		{name: "an upper-case resource is refused", in: "RepairRequests.repair.example.com", err: "RepairRequests"},
		{name: "a malformed group is refused", in: "repairrequests.repair..example.com", err: "repairrequests"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			got, err := ParseResources(tc.in)
			if tc.err != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.err)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(tc.want))
			g.Expect(Allowed{Resources: got}.String()).To(Equal(Allowed{Resources: tc.want}.String()))
		})
	}
}

// FuzzParseResources: whatever the flag says, parsing does not panic, and
// what it accepts has no wildcard and reads back the same.
func FuzzParseResources(f *testing.F) {
	f.Add("repairrequests.repair.example.com,configmaps")
	f.Add("*,a/b,,.")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseResources(s)
		if err != nil {
			return
		}
		again, err := ParseResources(Allowed{Resources: got}.String())
		if err != nil {
			t.Fatalf("reading back %v: %v", got, err)
		}
		if len(again) != len(got) {
			t.Fatalf("read back %v as %v", got, again)
		}
		for _, gr := range got {
			if strings.Contains(gr.String(), "*") {
				t.Fatalf("accepted a wildcard: %v", gr)
			}
		}
	})
}
