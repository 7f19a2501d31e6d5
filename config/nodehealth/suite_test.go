package nodehealth_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
	"github.com/gpuhealth/gpuhealth/internal/test/vapcheck"
)

// The suite runs a real kube-apiserver and etcd (envtest) with the CRDs from
// config/crd, applies this folder's policy and the operator's RBAC
// (config/rbac) as `kubectl apply -f` would, and then writes NodeHealths as
// two people, as the operator's service account and as an impersonated
// user.
var (
	testScheme  *runtime.Scheme
	testEnv     *envtest.Environment
	adminConfig *rest.Config
	admin       client.Client

	// The identities the tests act as, set by TestMain.
	alice    *identity // a person (client certificate), cluster-admin
	bob      *identity // another person, cluster-admin
	carol    *identity // envtest's admin impersonating carol
	operator *identity // gpuhealth-operator's service account
)

const (
	operatorNamespace = "gpuhealth-system"
	operatorSA        = "gpuhealth-operator"
	operatorUser      = "system:serviceaccount:gpuhealth-system:gpuhealth-operator"
	policyName        = "gpuhealth-request-requester"
	tokenLifetimeSecs = 3600
)

// identity is a credential the tests act with.
type identity struct {
	// user is the name the apiserver authenticates it as.
	user   string
	client client.Client
}

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(e *testenv.Env) error {
		testScheme, testEnv, adminConfig, admin = e.Scheme, e.Environment, e.Config, e.Client
		return setUp(context.Background())
	}))
}

// setUp installs the manifests and builds the identities the tests act as.
func setUp(ctx context.Context) error {
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", operatorNamespace, err)
	}
	for _, dir := range []string{".", filepath.Join("..", "rbac")} {
		if err := vapcheck.ApplyDir(ctx, admin, dir); err != nil {
			return err
		}
	}
	var err error
	for _, p := range []struct {
		id   **identity
		name string
	}{{&alice, "alice"}, {&bob, "bob"}} {
		// system:masters: the policy holds even a cluster-admin to their
		// own name.
		user, err := testEnv.AddUser(envtest.User{Name: p.name, Groups: []string{"system:masters"}}, nil)
		if err != nil {
			return fmt.Errorf("adding user %s: %w", p.name, err)
		}
		if *p.id, err = newIdentity(p.name, user.Config()); err != nil {
			return err
		}
	}
	impersonating := rest.CopyConfig(adminConfig)
	impersonating.Impersonate = rest.ImpersonationConfig{UserName: "carol", Groups: []string{"system:masters"}}
	if carol, err = newIdentity("carol", impersonating); err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(adminConfig)
	if err != nil {
		return err
	}
	tr, err := cs.CoreV1().ServiceAccounts(operatorNamespace).CreateToken(ctx, operatorSA, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](tokenLifetimeSecs)},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("requesting a token for %s/%s: %w", operatorNamespace, operatorSA, err)
	}
	tokenConfig := rest.AnonymousClientConfig(adminConfig)
	tokenConfig.BearerToken = tr.Status.Token
	operator, err = newIdentity(operatorUser, tokenConfig)
	return err
}

// newIdentity returns an identity of user with a client from cfg, after
// checking with a SelfSubjectReview that the apiserver names it user.
func newIdentity(user string, cfg *rest.Config) (*identity, error) {
	c, err := client.New(cfg, client.Options{Scheme: testScheme})
	if err != nil {
		return nil, fmt.Errorf("creating a client for %s: %w", user, err)
	}
	review := &authenticationv1.SelfSubjectReview{}
	if err := c.Create(context.Background(), review); err != nil {
		return nil, fmt.Errorf("asking who %s is: %w", user, err)
	}
	if got := review.Status.UserInfo.Username; got != user {
		return nil, fmt.Errorf("the apiserver names %s %q", user, got)
	}
	return &identity{user: user, client: c}, nil
}
