package handoff

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
)

// RefusedGroups are the API groups a Template hand-off never creates in,
// whatever the install allows: the core group (Pods, Secrets,
// ServiceAccounts), batch and apps (a Job or a Deployment is a pod spec
// that runs anything), rbac.authorization.k8s.io (a binding grants
// anything) and gpuhealth.dev (a NodeHealthEvent quarantines a node).
var RefusedGroups = []string{"", "batch", "apps", "rbac.authorization.k8s.io", "gpuhealth.dev"}

// Allowed is what a Template hand-off may create, as the install says.
// The zero value allows nothing.
type Allowed struct {
	// Resources are the resources (group and plural name) the install's
	// hand-off rules (chart value operator.handOff.rules) grant create on.
	Resources []schema.GroupResource
	// Namespace is the operator's own namespace, where a hand-off never
	// creates anything: the operator's Jobs and service accounts live there.
	Namespace string
}

// ParseResources reads a comma-separated list of resources, each
// resource.group as kubectl writes them ("repairrequests.repair.example.com")
// or a bare resource for the core group. Empty entries are skipped; a
// wildcard, a subresource or a malformed name is an error.
func ParseResources(s string) ([]schema.GroupResource, error) {
	var out []schema.GroupResource
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		if strings.ContainsAny(entry, "*/") {
			return nil, fmt.Errorf("hand-off resource %q: wildcards and subresources are not allowed", entry)
		}
		gr := schema.ParseGroupResource(entry)
		if errs := validation.IsDNS1035Label(gr.Resource); len(errs) > 0 {
			return nil, fmt.Errorf("hand-off resource %q: %s", entry, strings.Join(errs, "; "))
		}
		if gr.Group != "" {
			if errs := validation.IsDNS1123Subdomain(gr.Group); len(errs) > 0 {
				return nil, fmt.Errorf("hand-off resource %q: %s", entry, strings.Join(errs, "; "))
			}
		}
		if !slices.Contains(out, gr) {
			out = append(out, gr)
		}
	}
	return out, nil
}

// String lists the allowed resources as ParseResources reads them.
func (a Allowed) String() string {
	names := make([]string, 0, len(a.Resources))
	for _, gr := range a.Resources {
		names = append(names, gr.String())
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

// Permit says whether a Template hand-off may create want: its group is
// not one of RefusedGroups, its resource is on the install's list, and it
// is not in the operator's namespace. The kind is mapped to its resource
// with mapper, as RBAC names it. A refusal is permanent.
func (a Allowed) Permit(mapper meta.RESTMapper, want *unstructured.Unstructured) error {
	gvk := want.GroupVersionKind()
	if slices.Contains(RefusedGroups, gvk.Group) {
		return permanent("%s: a hand-off never creates objects of API group %q (refused: the core group, %s)",
			Describe(want), gvk.Group, strings.Join(RefusedGroups[1:], ", "))
	}
	mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return classify(err, Describe(want))
	}
	gr := mapping.Resource.GroupResource()
	if !slices.Contains(a.Resources, gr) {
		allowed := a.String()
		if allowed == "" {
			allowed = "none"
		}
		return permanent("%s: resource %s is not among those the install allows a hand-off to create (chart value operator.handOff.rules; allowed: %s)",
			Describe(want), gr, allowed)
	}
	if mapping.Scope.Name() != meta.RESTScopeNameNamespace {
		return nil
	}
	switch want.GetNamespace() {
	case "":
		return permanent("%s: the kind is namespaced and the template sets no metadata.namespace", Describe(want))
	case a.Namespace:
		return permanent("%s: a hand-off never creates objects in the operator's namespace %s", Describe(want), a.Namespace)
	}
	return nil
}
