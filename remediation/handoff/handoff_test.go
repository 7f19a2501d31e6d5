package handoff

import (
	"errors"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var owner = metav1.OwnerReference{APIVersion: "gpuhealth.dev/v1alpha1", Kind: "NodeHealth", Name: "gpu-7", UID: "u-1"}

func raw(s string) *runtime.RawExtension { return &runtime.RawExtension{Raw: []byte(s)} }

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
	for name, tmpl := range map[string]*runtime.RawExtension{
		"empty":           nil,
		"not an object":   raw(`[1,2]`),
		"no kind":         raw(`{"apiVersion":"v1","metadata":{"name":"x"}}`),
		"no name":         raw(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{}}`),
		"bad template":    raw(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"{{.NodeName"}}`),
		"unknown field":   raw(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"{{.Rack}}"}}`),
		"name left empty": raw(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"{{if false}}x{{end}}"}}`),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Render(tmpl, Data{NodeName: "n"}, owner)
			NewWithT(t).Expect(errors.Is(err, ErrPermanent)).To(BeTrue(), "%v", err)
		})
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
