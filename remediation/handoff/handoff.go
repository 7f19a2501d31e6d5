// Package handoff hands a node that must be replaced to the system that
// replaces nodes: it annotates the node's Cluster API Machine so that a
// MachineHealthCheck remediates it, or creates an object from a template
// (a provider's repair request, say). The decision is the nodehealth
// controller's; this package only renders, reads and writes: templates
// with their placeholders substituted literally (Render), only of the
// kinds the install allows (Allowed), and as the hand-off's own service
// account (NewClient).
package handoff

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Cluster API's names, as its documentation and API types give them: a
// node of a Cluster API cluster carries its Machine's name and namespace as
// annotations, and a MachineHealthCheck flags a Machine carrying
// RemediateMachineAnnotation as unhealthy whatever its checks say
// (condition HealthCheckSucceeded False, reason HasRemediateAnnotation),
// after which the Machine's owner (a MachineSet, a control plane) replaces it.
const (
	MachineAnnotation          = "cluster.x-k8s.io/machine"
	ClusterNamespaceAnnotation = "cluster.x-k8s.io/cluster-namespace"
	RemediateMachineAnnotation = "cluster.x-k8s.io/remediate-machine"
	// RequestedAnnotation records on the Machine that gpuhealth asked for
	// the remediation, and why.
	RequestedAnnotation = "gpuhealth.dev/remediation-requested"
)

// MachineGroupKind is Cluster API's Machine; its served version is looked up.
var MachineGroupKind = schema.GroupKind{Group: "cluster.x-k8s.io", Kind: "Machine"}

// ErrPermanent marks a hand-off that cannot succeed as things stand (no
// Machine, a template that does not render, no RBAC); retrying will not help
// until a human changes something.
var ErrPermanent = errors.New("hand-off not possible")

func permanent(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrPermanent}, a...)...)
}

// MachineKey finds the node's Machine from its Cluster API annotations.
func MachineKey(n *corev1.Node) (client.ObjectKey, error) {
	name, ns := n.Annotations[MachineAnnotation], n.Annotations[ClusterNamespaceAnnotation]
	if name == "" || ns == "" {
		return client.ObjectKey{}, permanent("node %s has no %s and %s annotations: it is not a Cluster API node", n.Name, MachineAnnotation, ClusterNamespaceAnnotation)
	}
	return client.ObjectKey{Namespace: ns, Name: name}, nil
}

// GetMachine reads the node's Machine in the version the apiserver
// prefers and checks that it is the node's (IsNodesMachine). A missing
// Machine, one that is not the node's, an unserved kind or a refused read
// is permanent.
func GetMachine(ctx context.Context, c client.Client, r client.Reader, n *corev1.Node) (*unstructured.Unstructured, error) {
	key, err := MachineKey(n)
	if err != nil {
		return nil, err
	}
	mapping, err := c.RESTMapper().RESTMapping(MachineGroupKind)
	if meta.IsNoMatchError(err) {
		return nil, permanent("Cluster API's Machine kind is not served: %v", err)
	}
	if err != nil {
		return nil, fmt.Errorf("looking up Cluster API's Machine kind: %w", err)
	}
	m := &unstructured.Unstructured{}
	m.SetGroupVersionKind(mapping.GroupVersionKind)
	if err := r.Get(ctx, key, m); err != nil {
		return nil, classify(err, "Machine "+key.String())
	}
	if err := IsNodesMachine(m, n); err != nil {
		return nil, err
	}
	return m, nil
}

// IsNodesMachine checks that the Machine is the node's by the Machine's own
// word: its status.nodeRef names the node, and carries the node's UID when
// it carries one (Cluster API's v1beta1 nodeRef does, v1beta2's does not).
// The node's annotations only say where to look: the kubelet may write its
// own node's annotations, so they cannot decide which Machine is replaced,
// while status.nodeRef is written by Cluster API's Machine controller.
func IsNodesMachine(m *unstructured.Unstructured, n *corev1.Node) error {
	what := "Machine " + client.ObjectKeyFromObject(m).String()
	name, found, err := unstructured.NestedString(m.Object, "status", "nodeRef", "name")
	if err != nil || !found || name == "" {
		return permanent("%s has no status.nodeRef.name, so it cannot be shown to be node %s's", what, n.Name)
	}
	if name != n.Name {
		return permanent("%s is node %s's (status.nodeRef), not node %s's, whose annotations name it", what, name, n.Name)
	}
	uid, _, err := unstructured.NestedString(m.Object, "status", "nodeRef", "uid")
	if err != nil {
		return permanent("%s's status.nodeRef.uid is not a string", what)
	}
	if uid != "" && types.UID(uid) != n.UID {
		return permanent("%s is that of an earlier node %s (status.nodeRef.uid %s, the node's is %s)", what, name, uid, n.UID)
	}
	return nil
}

// classify turns a read's error into a permanent one where retrying cannot help.
func classify(err error, what string) error {
	switch {
	case meta.IsNoMatchError(err):
		return permanent("the apiserver does not serve the kind of %s: %v", what, err)
	case apierrors.IsNotFound(err):
		return permanent("%s not found", what)
	case apierrors.IsForbidden(err):
		return permanent("the hand-off's service account %s may not act on %s (grant it with chart value operator.handOff): %v", ServiceAccount, what, err)
	}
	return fmt.Errorf("reading %s: %w", what, err)
}

// AnnotateMachine asks Cluster API to remediate the Machine. Idempotent.
func AnnotateMachine(ctx context.Context, c client.Client, m *unstructured.Unstructured, reason string) error {
	a := m.GetAnnotations()
	if _, ok := a[RemediateMachineAnnotation]; ok && a[RequestedAnnotation] != "" {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		RemediateMachineAnnotation: "", RequestedAnnotation: reason,
	}}})
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, m.DeepCopy(), client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("annotating Machine %s/%s: %w", m.GetNamespace(), m.GetName(), err)
	}
	return nil
}

// Unannotate takes back a remediation gpuhealth asked of the Machine (a
// node returned to service must not be replaced later); annotations
// someone else set are left alone. Idempotent.
func Unannotate(ctx context.Context, c client.Client, m *unstructured.Unstructured) error {
	if _, ours := m.GetAnnotations()[RequestedAnnotation]; !ours {
		return nil
	}
	patch := []byte(`{"metadata":{"annotations":{"` + RemediateMachineAnnotation + `":null,"` + RequestedAnnotation + `":null}}}`)
	if err := c.Patch(ctx, m.DeepCopy(), client.RawPatch(types.MergePatchType, patch)); err != nil && !apierrors.IsNotFound(err) {
		return classify(err, "Machine "+client.ObjectKeyFromObject(m).String())
	}
	return nil
}

// Ref names u whole for a status (its UID once it has one).
func Ref(u *unstructured.Unstructured) *gpuhealthv1alpha1.HandOffRef {
	return &gpuhealthv1alpha1.HandOffRef{APIVersion: u.GetAPIVersion(), Kind: u.GetKind(), Namespace: u.GetNamespace(), Name: u.GetName(), UID: u.GetUID()}
}

// FromRef is an object of ref's kind, namespace and name, to read by.
func FromRef(ref *gpuhealthv1alpha1.HandOffRef) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(ref.APIVersion)
	u.SetKind(ref.Kind)
	u.SetNamespace(ref.Namespace)
	u.SetName(ref.Name)
	return u
}

// Same says whether u is the object ref names: the same kind, namespace
// and name, and the same UID where ref has one.
func Same(ref *gpuhealthv1alpha1.HandOffRef, u *unstructured.Unstructured) bool {
	if ref == nil || u == nil {
		return false
	}
	gv, _ := schema.ParseGroupVersion(ref.APIVersion) // unparsable: the empty group, as Unstructured reads it
	return ref.Kind == u.GetKind() && ref.Namespace == u.GetNamespace() && ref.Name == u.GetName() &&
		u.GroupVersionKind().Group == gv.Group && (ref.UID == "" || ref.UID == u.GetUID())
}

// DeleteOwned deletes the object want names when owner owns it (one a
// human made is left alone) and, when uid is set, it is that very object
// (one made later under the same name is another). Idempotent.
func DeleteOwned(ctx context.Context, c client.Client, r client.Reader, want *unstructured.Unstructured, owner, uid types.UID) error {
	got, err := Get(ctx, r, want)
	if err != nil || got == nil {
		return err
	}
	if uid != "" && got.GetUID() != uid {
		return nil
	}
	for _, ref := range got.GetOwnerReferences() {
		if ref.UID == owner {
			if err := c.Delete(ctx, got); err != nil && !apierrors.IsNotFound(err) {
				return classify(err, Describe(got))
			}
			return nil
		}
	}
	return nil
}

// Data is what a template may use.
type Data struct {
	// NodeName is the node's name.
	NodeName string
	// Reason is why: ReplaceNode, RecertificationExhausted or CertificationExhausted.
	Reason string
	// Message is the failure in a sentence.
	Message string
}

// MaxRenderedBytes bounds what a template renders to, summed over its
// string values and the template itself: a repair request is a few
// hundred bytes, and an object this size is already large for etcd's
// liking, while the cap keeps a template from making the operator hold a
// large object every pass.
const MaxRenderedBytes = 64 << 10

// placeholders are the names a template's string values may use, written
// {{.Name}} (spaces inside the braces allowed, as Go templates allow them).
var placeholders = []string{".NodeName", ".Reason", ".Message"}

// value returns what placeholder name stands for; ok is false for an
// unknown name.
func (d Data) value(name string) (v string, ok bool) {
	switch name {
	case ".NodeName":
		return d.NodeName, true
	case ".Reason":
		return d.Reason, true
	case ".Message":
		return d.Message, true
	}
	return "", false
}

// Render makes the object a template describes: in every string value
// (never a key or the structure, so a value cannot inject fields) the
// placeholders {{.NodeName}}, {{.Reason}} and {{.Message}} are replaced
// literally by data's values; any other {{ is refused. No template engine
// runs, so nothing in a template loops or calls. The template and what it
// renders to are bounded by MaxRenderedBytes. The object is owned by
// owner and must name its apiVersion, kind and metadata.name.
func Render(tmpl *runtime.RawExtension, data Data, owner metav1.OwnerReference) (*unstructured.Unstructured, error) {
	if tmpl == nil || len(tmpl.Raw) == 0 {
		return nil, permanent("the policy's handOff.template is empty")
	}
	if len(tmpl.Raw) > MaxRenderedBytes {
		return nil, permanent("handOff.template is %d bytes, more than the %d allowed", len(tmpl.Raw), MaxRenderedBytes)
	}
	var obj map[string]any
	// apimachinery's decoder keeps whole numbers int64, as objects carry them.
	if err := utiljson.Unmarshal(tmpl.Raw, &obj); err != nil {
		return nil, permanent("handOff.template is not an object: %v", err)
	}
	if obj == nil {
		return nil, permanent("handOff.template is not an object")
	}
	// The template's own size counts once; what substitution adds counts on top.
	budget := MaxRenderedBytes - len(tmpl.Raw)
	rendered, err := render(obj, data, &budget)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: rendered.(map[string]any)}
	if u.GetAPIVersion() == "" || u.GetKind() == "" || u.GetName() == "" {
		return nil, permanent("handOff.template must set apiVersion, kind and metadata.name")
	}
	u.SetOwnerReferences(append(u.GetOwnerReferences(), owner))
	u.SetResourceVersion("")
	return u, nil
}

func render(v any, data Data, budget *int) (any, error) {
	switch x := v.(type) {
	case string:
		return substitute(x, data, budget)
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			r, err := render(e, data, budget)
			if err != nil {
				return nil, err
			}
			out[k] = r
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			r, err := render(e, data, budget)
			if err != nil {
				return nil, err
			}
			out[i] = r
		}
		return out, nil
	}
	return v, nil
}

// substitute replaces the placeholders in one string value, taking what
// each replacement adds from budget. A {{ that does not open a known
// placeholder is an error that names the placeholders there are.
func substitute(s string, data Data, budget *int) (string, error) {
	if !strings.Contains(s, "{{") {
		return s, nil
	}
	var b strings.Builder
	rest := s
	for {
		i := strings.Index(rest, "{{")
		if i < 0 {
			b.WriteString(rest)
			return b.String(), nil
		}
		b.WriteString(rest[:i])
		j := strings.Index(rest[i+2:], "}}")
		if j < 0 {
			return "", permanent("handOff.template value %q: unclosed {{", shorten(s))
		}
		name := strings.TrimSpace(rest[i+2 : i+2+j])
		v, ok := data.value(name)
		if !ok {
			return "", permanent("handOff.template value %q: unknown placeholder {{%s}}; the placeholders are {{%s}}",
				shorten(s), shorten(name), strings.Join(placeholders, "}}, {{"))
		}
		placeholder := rest[i : i+2+j+2]
		if *budget -= len(v) - len(placeholder); *budget < 0 {
			return "", permanent("handOff.template renders to more than %d bytes", MaxRenderedBytes)
		}
		b.WriteString(v)
		rest = rest[i+2+j+2:]
	}
}

// shorten cuts a template's text for an error message, which ends up in a
// status and an Event.
func shorten(s string) string {
	const most = 64
	if len(s) <= most {
		return s
	}
	return s[:most] + "…"
}

// Get reads the object a rendered template names; nil when it does not
// exist yet.
func Get(ctx context.Context, r client.Reader, want *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(want.GroupVersionKind())
	err := r.Get(ctx, client.ObjectKeyFromObject(want), got)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, classify(err, want.GetKind()+" "+client.ObjectKeyFromObject(want).String())
	}
	return got, nil
}

// Check asks the apiserver, in a dry run, whether the rendered object can
// be created: a namespace that does not exist, a schema the object breaks
// or missing RBAC is permanent, found before anything is written.
func Check(ctx context.Context, c client.Client, want *unstructured.Unstructured) error {
	err := c.Create(ctx, want.DeepCopy(), client.DryRunAll)
	switch {
	case err == nil, apierrors.IsAlreadyExists(err):
		return nil
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return permanent("%s cannot be created: %v", Describe(want), err)
	}
	return classify(err, Describe(want))
}

// Create creates the rendered object; one that exists already is left as it is.
func Create(ctx context.Context, c client.Client, want *unstructured.Unstructured) error {
	err := c.Create(ctx, want.DeepCopy())
	if err == nil || apierrors.IsAlreadyExists(err) {
		return nil
	}
	return fmt.Errorf("creating %s %s: %w", want.GetKind(), client.ObjectKeyFromObject(want), err)
}

// Describe names an object for a status: "Machine capi/m-1".
func Describe(u *unstructured.Unstructured) string {
	return u.GetKind() + " " + strings.TrimPrefix(client.ObjectKeyFromObject(u).String(), "/")
}

// Summarize is an object's status in a line: its conditions
// ("Ready=False (Provisioning)", sorted by type) or else its phase; empty
// when it reports neither.
func Summarize(u *unstructured.Unstructured) string {
	if u == nil {
		return ""
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	var parts []string
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok {
			continue
		}
		t, _ := m["type"].(string)
		s, _ := m["status"].(string)
		if t == "" {
			continue
		}
		p := t + "=" + s
		if r, _ := m["reason"].(string); r != "" {
			p += " (" + r + ")"
		}
		parts = append(parts, p)
	}
	if len(parts) > 0 {
		sort.Strings(parts)
		return strings.Join(parts, ", ")
	}
	if phase, _, _ := unstructured.NestedString(u.Object, "status", "phase"); phase != "" {
		return "phase " + phase
	}
	return ""
}
