package jobs_test

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
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// typeCheckTimeout bounds the wait for kube-controller-manager to start and
// type-check the policies.
const typeCheckTimeout = 60 * time.Second

// The apiserver compiles a policy's CEL when it is created but checks it
// against the CRD's schema (and the parameters' kind) only in
// kube-controller-manager's validatingadmissionpolicy-status-controller,
// which writes status.typeChecking. envtest runs no controller manager, so
// this test starts that one controller.
func TestPolicyTypeChecksAgainstTheCRDSchema(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	startPolicyStatusController(t)

	// A negative control: the same policy with a misspelt field must get a
	// warning, or an empty warning list proves nothing (a schema the checker
	// could not resolve would type everything dynamically, without warnings).
	objs, err := readManifests(manifest)
	g.Expect(err).NotTo(HaveOccurred())
	var misspelt *admissionregistrationv1.ValidatingAdmissionPolicy
	for _, o := range objs {
		if o.GetKind() == "ValidatingAdmissionPolicy" {
			misspelt = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, misspelt)).To(Succeed())
		}
	}
	g.Expect(misspelt).NotTo(BeNil())
	g.Expect(misspelt.Name).To(Equal(policyName))
	misspelt.Name = policyName + "-misspelt"
	misspelt.ResourceVersion = ""
	for i := range misspelt.Spec.Validations {
		v := &misspelt.Spec.Validations[i]
		v.Expression = strings.ReplaceAll(v.Expression, "serviceAccountName", "serviceAcountName")
		v.MessageExpression = strings.ReplaceAll(v.MessageExpression, "serviceAccountName", "serviceAcountName")
	}
	g.Expect(admin.Create(ctx, misspelt)).To(Succeed())
	t.Cleanup(func() { _ = admin.Delete(context.Background(), misspelt) })

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
		ContainElement(HaveField("Warning", ContainSubstring("serviceAcountName")))))
	g.Eventually(checked(policyName)).WithTimeout(typeCheckTimeout).Should(HaveField("ExpressionWarnings", BeEmpty()))
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
