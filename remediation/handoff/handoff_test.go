package handoff

import (
	"errors"
	"runtime"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var owner = metav1.OwnerReference{APIVersion: "gpuhealth.dev/v1alpha1", Kind: "NodeHealth", Name: "gpu-7", UID: "u-1"}

func raw(s string) *k8sruntime.RawExtension { return &k8sruntime.RawExtension{Raw: []byte(s)} }

func TestRenderSubstitutesStringValuesOnly(t *testing.T) {
	g := NewWithT(t)
	u, err := Render(raw(`{"apiVersion":"repair.example.com/v1","kind":"RepairRequest",
		"metadata":{"name":"repair-{{.NodeName}}","namespace":"infra","labels":{"node":"{{.NodeName}}"}},
		"spec":{"reason":"{{.Reason}}","note":"{{.Message}}","priority":3,"urgent":true,"hosts":["{{.NodeName}}"]}}`),
		Data{NodeName: "gpu-7", Reason: "ReplaceNode", Message: `"},"evil":{"x":"`}, owner)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(u.GetName()).To(Equal("repair-gpu-7"))
	g.Expect(u.GetLabels()).To(Equal(map[string]string{"node": "gpu-7"}))
	g.Expect(u.Object["spec"]).To(Equal(map[string]any{
		"reason": "ReplaceNode", "note": `"},"evil":{"x":"`, "priority": int64(3), "urgent": true, "hosts": []any{"gpu-7"},
	}), "a value cannot add fields; numbers and booleans stay as they are")
	g.Expect(u.GetOwnerReferences()).To(Equal([]metav1.OwnerReference{owner}))
	g.Expect(Describe(u)).To(Equal("RepairRequest infra/repair-gpu-7"))
}

func TestRenderRefusesWhatCannotBeCreated(t *testing.T) {
	for name, tmpl := range map[string]*k8sruntime.RawExtension{
		"empty":           nil,
		"not an object":   raw(`[1,2]`),
		"no kind":         raw(`{"apiVersion":"v1","metadata":{"name":"x"}}`),
		"no name":         raw(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{}}`),
		"bad template":    raw(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"{{.NodeName"}}`),
		"unknown field":   raw(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"{{.Rack}}"}}`),
		"name left empty": raw(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"{{if false}}x{{end}}"}}`),
		"a loop":          raw(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"n"},"data":{"x":"{{range 100000000}}x{{end}}"}}`),
		"a function call": raw(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"{{printf \"%s\" .NodeName}}"}}`),
		"a pipeline":      raw(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"{{.NodeName | len}}"}}`),
		"too large":       raw(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"n"},"data":{"x":"` + strings.Repeat("x", MaxRenderedBytes) + `"}}`),
		"null":            raw(`null`),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Render(tmpl, Data{NodeName: "n"}, owner)
			NewWithT(t).Expect(errors.Is(err, ErrPermanent)).To(BeTrue(), "%v", err)
		})
	}
}

// TestRenderSubstitutesLiterally: the placeholders, with or without
// spaces inside the braces, are replaced by the values as they are; a
// value that itself looks like a placeholder or a template action stays
// text.
func TestRenderSubstitutesLiterally(t *testing.T) {
	g := NewWithT(t)
	u, err := Render(raw(`{"apiVersion":"repair.example.com/v1","kind":"RepairRequest","metadata":{"name":"r-{{ .NodeName }}"},
		"spec":{"note":"{{.Message}}/{{.Message}}","why":"{{.Reason}}"}}`),
		Data{NodeName: "gpu-7", Reason: "{{.NodeName}}", Message: "{{range 9}}x{{end}}"}, owner)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(u.GetName()).To(Equal("r-gpu-7"))
	g.Expect(u.Object["spec"]).To(Equal(map[string]any{"note": "{{range 9}}x{{end}}/{{range 9}}x{{end}}", "why": "{{.NodeName}}"}))
}

// TestRenderBoundsWhatSubstitutionAdds: a template far under the cap that
// repeats a long message past it is refused, and refusing it holds no
// more than the cap in memory.
func TestRenderBoundsWhatSubstitutionAdds(t *testing.T) {
	g := NewWithT(t)
	tmpl := raw(`{"apiVersion":"repair.example.com/v1","kind":"RepairRequest","metadata":{"name":"r"},"spec":{"note":"` +
		strings.Repeat("{{.Message}}", 2000) + `"}}`)
	data := Data{NodeName: "n", Message: strings.Repeat("m", 1024)}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := Render(tmpl, data, owner)
	runtime.ReadMemStats(&after)
	g.Expect(errors.Is(err, ErrPermanent)).To(BeTrue(), "%v", err)
	g.Expect(err).To(MatchError(ContainSubstring("more than 65536 bytes")))
	g.Expect(after.TotalAlloc-before.TotalAlloc).To(BeNumerically("<", 1<<20), "2 MiB unrendered")

	data.Message = strings.Repeat("m", 10)
	_, err = Render(tmpl, data, owner)
	g.Expect(err).NotTo(HaveOccurred(), "the same template with a short message fits")
}

// FuzzRender: whatever the template and data, Render does not panic, an
// error is permanent, and what it renders stays under the cap and holds
// no {{ the data did not bring.
func FuzzRender(f *testing.F) {
	f.Add(`{"apiVersion":"v1","kind":"RepairRequest","metadata":{"name":"r-{{.NodeName}}"},"spec":{"x":["{{ .Reason }}",1,true]}}`, "gpu-1", "ReplaceNode", "dead")
	f.Add(`{"apiVersion":"v1","kind":"K","metadata":{"name":"{{range 100000000}}x{{end}}"}}`, "n", "", "")
	f.Add(`{"apiVersion":"v1","kind":"K","metadata":{"name":"{{.Message}}{{.Message}}{{"}}`, "n", "", "{{")
	f.Add(`{"a":"{{.NodeName}}}}}"}`, "}}", "{{", "{{.Reason}}")
	f.Fuzz(func(t *testing.T, tmpl, node, reason, message string) {
		u, err := Render(raw(tmpl), Data{NodeName: node, Reason: reason, Message: message}, owner)
		if err != nil {
			if !errors.Is(err, ErrPermanent) {
				t.Fatalf("error not permanent: %v", err)
			}
			return
		}
		var size int
		var survived bool
		walkStrings(u.Object, func(v string) {
			size += len(v)
			survived = survived || strings.Contains(v, "{{")
		})
		// A byte that is not UTF-8 decodes to U+FFFD, three bytes; the
		// owner reference adds a few.
		if size > 3*MaxRenderedBytes+1024 {
			t.Fatalf("rendered %d bytes of string values", size)
		}
		if survived && !strings.Contains(node+reason+message, "{{") {
			t.Fatalf("a {{ survived rendering: %v", u.Object)
		}
	})
}

// walkStrings calls f with every string value (not key) under v.
func walkStrings(v any, f func(string)) {
	switch x := v.(type) {
	case string:
		f(x)
	case map[string]any:
		for _, e := range x {
			walkStrings(e, f)
		}
	case []any:
		for _, e := range x {
			walkStrings(e, f)
		}
	}
}

func TestMachineKey(t *testing.T) {
	g := NewWithT(t)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-7", Annotations: map[string]string{MachineAnnotation: "md-0-abc", ClusterNamespaceAnnotation: "capi"}}}
	key, err := MachineKey(n)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(key.String()).To(Equal("capi/md-0-abc"))
	delete(n.Annotations, ClusterNamespaceAnnotation)
	_, err = MachineKey(n)
	g.Expect(errors.Is(err, ErrPermanent)).To(BeTrue())
	g.Expect(err).To(MatchError(ContainSubstring("not a Cluster API node")))
}

func TestIsNodesMachine(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-7", UID: "node-uid"}}
	machine := func(nodeRef map[string]any) *unstructured.Unstructured {
		m := &unstructured.Unstructured{Object: map[string]any{"status": map[string]any{}}}
		m.SetNamespace("capi")
		m.SetName("md-0-abc")
		if nodeRef != nil {
			m.Object["status"] = map[string]any{"nodeRef": nodeRef}
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		nodeRef map[string]any
		want    string
	}{
		{name: "a nodeRef with the node's name and UID is the node's", nodeRef: map[string]any{"kind": "Node", "name": "gpu-7", "uid": "node-uid"}},
		{name: "a nodeRef with the node's name and no UID (v1beta2) is the node's", nodeRef: map[string]any{"name": "gpu-7"}},
		{name: "a Machine without a nodeRef is refused", want: "has no status.nodeRef.name"},
		{name: "a nodeRef naming another node is refused", nodeRef: map[string]any{"name": "gpu-8"}, want: "is node gpu-8's (status.nodeRef), not node gpu-7's"},
		{name: "a nodeRef with another node's UID is refused", nodeRef: map[string]any{"name": "gpu-7", "uid": "old"}, want: "earlier node gpu-7"},
		{name: "a nodeRef whose name is not a string is refused", nodeRef: map[string]any{"name": int64(7)}, want: "has no status.nodeRef.name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			err := IsNodesMachine(machine(tc.nodeRef), n)
			if tc.want == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(errors.Is(err, ErrPermanent)).To(BeTrue(), "%v", err)
			g.Expect(err).To(MatchError(ContainSubstring(tc.want)))
		})
	}
}

func TestSummarize(t *testing.T) {
	g := NewWithT(t)
	g.Expect(Summarize(nil)).To(BeEmpty())
	u := &unstructured.Unstructured{Object: map[string]any{}}
	g.Expect(Summarize(u)).To(BeEmpty())
	u.Object["status"] = map[string]any{"phase": "Repairing"}
	g.Expect(Summarize(u)).To(Equal("phase Repairing"))
	u.Object["status"] = map[string]any{"phase": "x", "conditions": []any{
		map[string]any{"type": "Ready", "status": "False", "reason": "Deleting"},
		map[string]any{"type": "HealthCheckSucceeded", "status": "False", "reason": "HasRemediateAnnotation"},
		map[string]any{"status": "True"},
		"junk",
	}}
	g.Expect(Summarize(u)).To(Equal("HealthCheckSucceeded=False (HasRemediateAnnotation), Ready=False (Deleting)"))
}

func TestClassify(t *testing.T) {
	g := NewWithT(t)
	gr := schema.GroupResource{Group: "repair.example.com", Resource: "repairrequests"}
	for _, err := range []error{
		apierrors.NewNotFound(gr, "x"),
		apierrors.NewForbidden(gr, "x", errors.New("no RBAC")),
		&meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: "repair.example.com", Kind: "RepairRequest"}},
	} {
		g.Expect(errors.Is(classify(err, "RepairRequest infra/x"), ErrPermanent)).To(BeTrue(), "%v", err)
	}
	transient := classify(apierrors.NewServerTimeout(gr, "get", 1), "RepairRequest infra/x")
	g.Expect(errors.Is(transient, ErrPermanent)).To(BeFalse(), "retried")
}
