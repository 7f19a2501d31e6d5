package v1alpha1_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// readYAMLObjects reads every object of every YAML file in dir.
func readYAMLObjects(t *testing.T, dir string) map[string]*unstructured.Unstructured {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no YAML files in %s (err %v)", dir, err)
	}
	out := map[string]*unstructured.Unstructured{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range strings.Split(string(data), "\n---") {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			out[fmt.Sprintf("%s#%d", filepath.Base(f), i)] = u
		}
	}
	return out
}

// subsetDiff returns the first path at which want is not contained in got,
// or "" when every field of want is in got with the same value (got may have
// more: defaults the apiserver filled in).
func subsetDiff(path string, want, got any) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return path
		}
		for k, wv := range w {
			if d := subsetDiff(path+"."+k, wv, g[k]); d != "" {
				return d
			}
		}
		return ""
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return path
		}
		for i := range w {
			if d := subsetDiff(fmt.Sprintf("%s[%d]", path, i), w[i], g[i]); d != "" {
				return d
			}
		}
		return ""
	default:
		// Numbers come back from JSON as int64 or float64 depending on the decoder.
		if fmt.Sprint(want) != fmt.Sprint(got) {
			return fmt.Sprintf("%s (want %v, got %v)", path, want, got)
		}
		return ""
	}
}

func TestSamplesAreAcceptedUnchanged(t *testing.T) {
	ctx := context.Background()
	samples := readYAMLObjects(t, filepath.Join("..", "..", "config", "samples"))
	kinds := map[string]bool{}
	for file, sample := range samples {
		t.Run(file, func(t *testing.T) {
			g := NewWithT(t)
			obj := sample.DeepCopy()
			obj.SetName("sample-" + obj.GetName())
			// Strict field validation: a sample with a field the schema
			// would drop is a broken sample.
			g.Expect(k8sClient.Create(ctx, obj, client.FieldValidation("Strict"))).To(Succeed())
			t.Cleanup(func() { _ = k8sClient.Delete(ctx, obj) })

			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(obj.GroupVersionKind())
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
			want := sample.DeepCopy()
			want.SetName(obj.GetName())
			g.Expect(subsetDiff("", want.Object, got.Object)).To(BeEmpty(), "the apiserver changed the sample")
			kinds[sample.GetKind()] = true
		})
	}
	NewWithT(t).Expect(kinds).To(HaveLen(3), "config/samples must hold a sample of each kind")
}

func TestUnknownFieldsAreDroppedWithAWarning(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	warnings := &warningRecorder{}
	cfg := rest.CopyConfig(restConfig)
	cfg.WarningHandler = warnings
	c, err := client.New(cfg, client.Options{Scheme: testScheme})
	g.Expect(err).NotTo(HaveOccurred())

	obj := validEvent("unknown-field")
	set(obj, "high", "spec", "priority")
	g.Expect(c.Create(ctx, obj)).To(Succeed())
	t.Cleanup(func() { _ = c.Delete(ctx, obj) })

	g.Expect(warnings.all()).To(ContainElement(ContainSubstring(`unknown field "spec.priority"`)))
	got := &gpuhealthv1alpha1.NodeHealthEvent{}
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
	raw, err := json.Marshal(got)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(raw)).NotTo(ContainSubstring("priority"))
	g.Expect(got.Spec.Code).To(Equal("79"), "known fields survive")
}

type warningRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningRecorder) HandleWarningHeader(_ int, _ string, message string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, message)
}

func (w *warningRecorder) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

func TestPolicyDefaults(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := &gpuhealthv1alpha1.RemediationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "defaults"}}
	g.Expect(k8sClient.Create(ctx, p)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(ctx, p) })

	s := p.Spec
	g.Expect(s.NodeSelector).NotTo(BeNil())
	g.Expect(s.NodeSelector.MatchLabels).To(Equal(map[string]string{"nvidia.com/gpu.present": "true"}))
	g.Expect(*s.Quarantine.Cordon).To(BeTrue())
	g.Expect(*s.Quarantine.Taint).To(Equal(gpuhealthv1alpha1.TaintSpec{Key: "gpuhealth.dev/quarantined", Effect: "NoSchedule"}))
	g.Expect(s.Drain.DefaultMode).To(Equal(gpuhealthv1alpha1.DrainEvict))
	g.Expect(s.Drain.Timeout.Get(0)).To(Equal(time.Hour))
	g.Expect(s.Drain.EvictionsPerSecond).To(BeEquivalentTo(20))
	g.Expect(s.Recertification.MaxAttempts).To(BeEquivalentTo(3))
	g.Expect(s.Recertification.MaxNotRun).To(BeEquivalentTo(3))
	g.Expect(s.Recertification.SoakWindow.Get(0)).To(Equal(10 * time.Minute))
	g.Expect(s.Budgets.MaxUnavailable.String()).To(Equal("10%"))
	g.Expect(s.Budgets.MaxUnavailablePerClique.IntValue()).To(Equal(1))
	g.Expect(s.Budgets.MaxUnavailablePerComputeDomain.IntValue()).To(Equal(1))
	g.Expect(s.ComputeDomain.LeaveTimeout.Get(0)).To(Equal(10 * time.Minute))
	g.Expect(s.ComputeDomain.DeadMemberGracePeriod.Get(0)).To(Equal(5 * time.Minute))
	g.Expect(s.ComputeDomain.NotReadyIsDead).To(BeFalse())
	g.Expect(*s.ComputeDomain.TaintDegradedCliques).To(BeTrue())
	g.Expect(*s.CircuitBreaker.Enabled).To(BeTrue())
	g.Expect(s.CircuitBreaker.CoolDown.Get(0)).To(Equal(30 * time.Minute))
	g.Expect(s.DryRun).To(BeFalse())
}

// TestEventTableColumns fetches the Table form that `kubectl get
// nodehealthevents` prints and checks its columns and a row.
func TestEventTableColumns(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ev := &gpuhealthv1alpha1.NodeHealthEvent{
		ObjectMeta: metav1.ObjectMeta{Name: gpuhealthv1alpha1.EventName("table-node", "kmsg", "XID", "GPU-aaaa", "79")},
		Spec: gpuhealthv1alpha1.NodeHealthEventSpec{
			NodeName:          "table-node",
			Source:            gpuhealthv1alpha1.SourceKmsg,
			Check:             gpuhealthv1alpha1.CheckXID,
			Component:         gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "GPU-aaaa"},
			Code:              "79",
			Severity:          gpuhealthv1alpha1.SeverityFatal,
			RecommendedAction: gpuhealthv1alpha1.ActionRebootNode,
			Message:           "GPU has fallen off the bus.",
		},
	}
	g.Expect(k8sClient.Create(ctx, ev)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(ctx, ev) })
	now := metav1.Now()
	ev.Status = gpuhealthv1alpha1.NodeHealthEventStatus{Count: 3, FirstSeen: &now, LastSeen: &now, Phase: gpuhealthv1alpha1.EventActive}
	g.Expect(k8sClient.Status().Update(ctx, ev)).To(Succeed())

	cfg := rest.CopyConfig(restConfig)
	cfg.GroupVersion = &gpuhealthv1alpha1.GroupVersion
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(testScheme).WithoutConversion()
	rc, err := rest.RESTClientFor(cfg)
	g.Expect(err).NotTo(HaveOccurred())
	raw, err := rc.Get().Resource("nodehealthevents").Name(ev.Name).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	table := &metav1.Table{}
	g.Expect(json.Unmarshal(raw, table)).To(Succeed())

	var names, wide []string
	for _, c := range table.ColumnDefinitions {
		if c.Priority == 0 {
			names = append(names, c.Name)
		} else {
			wide = append(wide, c.Name)
		}
	}
	g.Expect(names).To(Equal([]string{"Name", "Node", "Source", "Check", "Code", "Severity", "Action", "Count", "Phase", "Age"}))
	g.Expect(wide).To(Equal([]string{"Component", "Instance", "Message"}), "-o wide adds the component, its MIG instance and the message")
	g.Expect(table.Rows).To(HaveLen(1))
	cells := table.Rows[0].Cells
	g.Expect(cells[:9]).To(Equal([]any{ev.Name, "table-node", "kmsg", "XID", "79", "Fatal", "RebootNode", float64(3), "Active"}))
	g.Expect(cells[9]).To(MatchRegexp(`^[0-9]+s$`), "age of a new event")
	g.Expect(cells[10:]).To(Equal([]any{"GPU-aaaa", nil, "GPU has fallen off the bus."}))
}

// TestEveryFieldIsDocumented walks the generated CRDs: every property must
// carry a description, so `kubectl explain` documents every field.
func TestEveryFieldIsDocumented(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "config", "crd", "*.yaml"))
	if err != nil || len(files) != 4 {
		t.Fatalf("want 4 CRDs in config/crd, found %v (err %v)", files, err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(data, crd); err != nil {
			t.Fatal(err)
		}
		NewWithT(t).Expect(crd.Spec.Names.Categories).To(ContainElement("gpuhealth"), "%s: kubectl get gpuhealth lists every kind", f)
		var missing []string
		for _, v := range crd.Spec.Versions {
			root := *v.Schema.OpenAPIV3Schema
			// metadata is the standard ObjectMeta, which the apiserver documents itself.
			delete(root.Properties, "metadata")
			collectUndocumented(crd.Spec.Names.Kind, root, &missing)
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			t.Errorf("%s: fields without a description:\n  %s", filepath.Base(f), strings.Join(missing, "\n  "))
		}
	}
}

func collectUndocumented(path string, s apiextensionsv1.JSONSchemaProps, missing *[]string) {
	for name, p := range s.Properties {
		child := path + "." + name
		if strings.TrimSpace(p.Description) == "" {
			*missing = append(*missing, child)
		}
		collectUndocumented(child, p, missing)
	}
	if s.Items != nil && s.Items.Schema != nil {
		collectUndocumented(path+"[]", *s.Items.Schema, missing)
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
		collectUndocumented(path+"{}", *s.AdditionalProperties.Schema, missing)
	}
}
