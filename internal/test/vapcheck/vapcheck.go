// Package vapcheck holds what the tests of gpuhealth's
// ValidatingAdmissionPolicies share: reading and applying their manifests,
// and checking a policy's CEL against the schemas it reads, as
// kube-controller-manager does, in envtest.
package vapcheck

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// typeCheckTimeout bounds the wait for kube-controller-manager to start and
// type-check a policy.
const typeCheckTimeout = 60 * time.Second

// ReadManifests decodes every document of a multi-document YAML file.
func ReadManifests(file string) ([]*unstructured.Unstructured, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var objs []*unstructured.Unstructured
	for {
		obj := &unstructured.Unstructured{}
		err := dec.Decode(&obj.Object)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decoding %s: %w", file, err)
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
}

// ApplyDir creates every object of every YAML file in dir, as
// `kubectl apply -f dir` would on an empty cluster, with strict field
// validation.
func ApplyDir(ctx context.Context, c client.Client, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no manifests in %s", dir)
	}
	slices.Sort(files)
	for _, file := range files {
		objs, err := ReadManifests(file)
		if err != nil {
			return err
		}
		for _, obj := range objs {
			if err := c.Create(ctx, obj, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
				return fmt.Errorf("applying %s %s from %s: %w", obj.GetKind(), obj.GetName(), file, err)
			}
		}
	}
	return nil
}

// Misspelling is the negative control of a type check: every occurrence
// of Field in the policy's expressions becomes Misspelt, and the checker
// must warn about Warned.
type Misspelling struct {
	Field, Misspelt, Warned string
}

// TypeChecks checks the ValidatingAdmissionPolicy in file against the
// schemas it reads. The apiserver compiles a policy's CEL when it is
// created but checks it against the CRD's schema (and the parameters'
// kind) only in kube-controller-manager's
// validatingadmissionpolicy-status-controller, which writes
// status.typeChecking; envtest runs no controller manager, so this starts
// that one controller. The checker reads the schema from the apiserver's
// OpenAPI, published a moment after a CRD is installed, and a policy
// checked before that is typed dynamically (no warnings) and not checked
// again: so it waits until the OpenAPI document of groupVersion names
// m.Field (its last segment), then creates a copy of the policy and a copy with m applied. The
// copy must type-check without warnings, and the misspelt one must warn
// (an empty warning list alone would prove nothing).
func TypeChecks(t *testing.T, env *envtest.Environment, c client.Client, file, groupVersion string, m Misspelling) {
	t.Helper()
	g := gomega.NewWithT(t)
	ctx := context.Background()
	startPolicyStatusController(t, env)
	awaitOpenAPISchema(t, env, groupVersion, m.Field[strings.LastIndex(m.Field, ".")+1:])

	objs, err := ReadManifests(file)
	g.Expect(err).NotTo(gomega.HaveOccurred())
	var policy *admissionregistrationv1.ValidatingAdmissionPolicy
	for _, o := range objs {
		if o.GetKind() == "ValidatingAdmissionPolicy" {
			policy = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, policy)).To(gomega.Succeed())
		}
	}
	g.Expect(policy).NotTo(gomega.BeNil(), "%s holds no ValidatingAdmissionPolicy", file)
	policy.ResourceVersion = ""
	misspelt := policy.DeepCopy()
	policy.Name += "-copy"
	misspelt.Name += "-misspelt"
	for i := range misspelt.Spec.Validations {
		v := &misspelt.Spec.Validations[i]
		v.Expression = strings.ReplaceAll(v.Expression, m.Field, m.Misspelt)
		v.MessageExpression = strings.ReplaceAll(v.MessageExpression, m.Field, m.Misspelt)
	}
	for _, p := range []*admissionregistrationv1.ValidatingAdmissionPolicy{policy, misspelt} {
		g.Expect(c.Create(ctx, p)).To(gomega.Succeed())
		t.Cleanup(func() { _ = c.Delete(context.Background(), p) })
	}
	checked := func(name string) func(gomega.Gomega) *admissionregistrationv1.TypeChecking {
		return func(g gomega.Gomega) *admissionregistrationv1.TypeChecking {
			p := &admissionregistrationv1.ValidatingAdmissionPolicy{}
			g.Expect(c.Get(ctx, client.ObjectKey{Name: name}, p)).To(gomega.Succeed())
			g.Expect(p.Status.ObservedGeneration).To(gomega.Equal(p.Generation))
			g.Expect(p.Status.TypeChecking).NotTo(gomega.BeNil())
			return p.Status.TypeChecking
		}
	}
	g.Eventually(checked(misspelt.Name)).WithTimeout(typeCheckTimeout).Should(gomega.HaveField("ExpressionWarnings",
		gomega.ContainElement(gomega.HaveField("Warning", gomega.ContainSubstring(m.Warned)))))
	g.Eventually(checked(policy.Name)).WithTimeout(typeCheckTimeout).Should(gomega.HaveField("ExpressionWarnings", gomega.BeEmpty()))
}

// awaitOpenAPISchema waits until the apiserver's OpenAPI v3 document of
// groupVersion ("gpuhealth.dev/v1alpha1") has field in it.
func awaitOpenAPISchema(t *testing.T, env *envtest.Environment, groupVersion, field string) {
	t.Helper()
	d, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	gomega.NewWithT(t).Eventually(func(g gomega.Gomega) string {
		paths, err := d.OpenAPIV3().Paths()
		g.Expect(err).NotTo(gomega.HaveOccurred())
		gv, ok := paths["apis/"+groupVersion]
		g.Expect(ok).To(gomega.BeTrue(), "%s is not in the OpenAPI v3 document yet", groupVersion)
		doc, err := gv.Schema("application/json")
		g.Expect(err).NotTo(gomega.HaveOccurred())
		return string(doc)
	}).WithTimeout(typeCheckTimeout).WithPolling(200 * time.Millisecond).Should(gomega.ContainSubstring(`"` + field + `"`))
}

// startPolicyStatusController runs kube-controller-manager from
// KUBEBUILDER_ASSETS (hack/controlplane.sh builds it next to kube-apiserver)
// with only the validatingadmissionpolicy-status-controller, until the test
// ends.
func startPolicyStatusController(t *testing.T, env *envtest.Environment) {
	t.Helper()
	bin := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kube-controller-manager")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kube-controller-manager is needed to type-check the policy: %v (hack/controlplane.sh builds it)", err)
	}
	user, err := env.AddUser(envtest.User{Name: "kube-controller-manager", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatalf("adding a user for kube-controller-manager: %v", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		t.Fatalf("writing kube-controller-manager's kubeconfig: %v", err)
	}
	dir := t.TempDir()
	kubeconfigPath := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "kube-controller-manager.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin,
		"--kubeconfig="+kubeconfigPath,
		"--controllers=validatingadmissionpolicy-status-controller",
		"--leader-elect=false",
		"--secure-port=0", // serve nothing: the test needs only the controller
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting kube-controller-manager: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logFile.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("kube-controller-manager log:\n%s", out)
		}
	})
}
