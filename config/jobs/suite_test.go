package jobs_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
	"github.com/gpuhealth/gpuhealth/internal/test/vapcheck"
)

// The suite runs a real kube-apiserver and etcd (envtest) with the CRDs
// from config/crd, applies jobs.yaml (rendered from the chart with its
// default values) as `kubectl apply -f` would, and acts as a policy
// editor: a service account whose only rights are to edit
// RemediationPolicies, impersonated.
var (
	testEnv *envtest.Environment
	admin   client.Client
	// editor is the policy editor's client.
	editor client.Client
)

const (
	namespace      = "gpuhealth-system"
	editorNS       = "platform"
	editorSA       = "policy-editor"
	policyName     = "gpuhealth-policy-jobs"
	manifest       = "jobs.yaml"
	samplePolicy   = "../samples/gpuhealth_v1alpha1_remediationpolicy.yaml"
	editorUsername = "system:serviceaccount:" + editorNS + ":" + editorSA
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(e *testenv.Env) error {
		testEnv, admin = e.Environment, e.Client
		return setUp(context.Background(), e.Config)
	}))
}

func setUp(ctx context.Context, cfg *rest.Config) error {
	for _, ns := range []string{namespace, editorNS} {
		if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return fmt.Errorf("creating namespace %s: %w", ns, err)
		}
	}
	objs, err := vapcheck.ReadManifests(manifest)
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if err := admin.Create(ctx, obj, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
			return fmt.Errorf("applying %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
	}
	// The editor may do everything to RemediationPolicies and nothing else.
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: editorSA},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"gpuhealth.dev"}, Resources: []string{"remediationpolicies"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: editorSA},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: editorSA},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: editorSA, Namespace: editorNS}},
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: editorSA, Namespace: editorNS}}
	for _, o := range []client.Object{sa, role, binding} {
		if err := admin.Create(ctx, o); err != nil {
			return fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}
	as := rest.CopyConfig(cfg)
	as.Impersonate = rest.ImpersonationConfig{UserName: editorUsername,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + editorNS, "system:authenticated"}}
	editor, err = client.New(as, client.Options{Scheme: admin.Scheme()})
	return err
}
