package nodehealth_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// typeCheckTimeout bounds the wait for kube-controller-manager to start and
// type-check the policies.
const typeCheckTimeout = 60 * time.Second

// The apiserver compiles a policy's CEL when it is created but checks it
// against the CRD's schema only in kube-controller-manager's
// validatingadmissionpolicy-status-controller, which writes
// status.typeChecking. envtest runs no controller manager, so this test
// starts that one controller.
func TestPolicyTypeChecksAgainstTheCRDSchema(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	startPolicyStatusController(t)

	// The checker reads the CRD's schema from the apiserver's OpenAPI, which
	// the apiserver publishes a moment after the CRD is installed; a policy
	// checked before that is typed dynamically, without warnings, and not
	// checked again. So the checked policies are copies created once the
	// schema is published.
	awaitOpenAPISchema(t, "requestedBy")

	// A negative control: the same policy with a misspelt field must get a
	// warning, or an empty warning list proves nothing (a schema the checker
	// could not resolve would type everything dynamically, without warnings).
	objs, err := readManifests("request_policy.yaml")
	g.Expect(err).NotTo(HaveOccurred())
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{}
	g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(objs[0].Object, policy)).To(Succeed())
	g.Expect(objs[0].GetKind()).To(Equal("ValidatingAdmissionPolicy"))
	g.Expect(policy.Name).To(Equal(policyName))
	misspelt := policy.DeepCopy()
	policy.Name = policyName + "-copy"
	misspelt.Name = policyName + "-misspelt"
	for i := range misspelt.Spec.Validations {
		misspelt.Spec.Validations[i].Expression = strings.ReplaceAll(misspelt.Spec.Validations[i].Expression, "request.requestedBy", "request.requestedB")
	}
	for _, p := range []*admissionregistrationv1.ValidatingAdmissionPolicy{policy, misspelt} {
		g.Expect(admin.Create(ctx, p)).To(Succeed())
		t.Cleanup(func() { _ = admin.Delete(context.Background(), p) })
	}

	checked := func(name string) func(Gomega) *admissionregistrationv1.TypeChecking {
		return func(g Gomega) *admissionregistrationv1.TypeChecking {
			p := &admissionregistrationv1.ValidatingAdmissionPolicy{}
			g.Expect(admin.Get(ctx, client.ObjectKey{Name: name}, p)).To(Succeed())
			g.Expect(p.Status.ObservedGeneration).To(Equal(p.Generation))
			g.Expect(p.Status.TypeChecking).NotTo(BeNil())
			return p.Status.TypeChecking
		}
	}
	g.Eventually(checked(misspelt.Name)).WithTimeout(typeCheckTimeout).Should(HaveField("ExpressionWarnings",
		ContainElement(HaveField("Warning", ContainSubstring("requestedB")))))
	g.Eventually(checked(policy.Name)).WithTimeout(typeCheckTimeout).Should(HaveField("ExpressionWarnings", BeEmpty()))
}

// awaitOpenAPISchema waits until the apiserver's OpenAPI v3 document of
// gpuhealth.dev/v1alpha1 has field in it.
func awaitOpenAPISchema(t *testing.T, field string) {
	t.Helper()
	d, err := discovery.NewDiscoveryClientForConfig(adminConfig)
	if err != nil {
		t.Fatal(err)
	}
	NewWithT(t).Eventually(func(g Gomega) string {
		paths, err := d.OpenAPIV3().Paths()
		g.Expect(err).NotTo(HaveOccurred())
		gv, ok := paths["apis/gpuhealth.dev/v1alpha1"]
		g.Expect(ok).To(BeTrue(), "gpuhealth.dev/v1alpha1 is not in the OpenAPI v3 document yet")
		doc, err := gv.Schema("application/json")
		g.Expect(err).NotTo(HaveOccurred())
		return string(doc)
	}).WithTimeout(typeCheckTimeout).WithPolling(200 * time.Millisecond).Should(ContainSubstring(`"` + field + `"`))
}

// startPolicyStatusController runs kube-controller-manager from
// KUBEBUILDER_ASSETS (hack/controlplane.sh builds it next to kube-apiserver)
// with only the validatingadmissionpolicy-status-controller, until the test ends.
func startPolicyStatusController(t *testing.T) {
	t.Helper()
	bin := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kube-controller-manager")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kube-controller-manager is needed to type-check the policy: %v (hack/controlplane.sh builds it)", err)
	}
	user, err := testEnv.AddUser(envtest.User{Name: "kube-controller-manager", Groups: []string{"system:masters"}}, nil)
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
