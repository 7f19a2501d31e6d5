package monitor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
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
// config/crd, applies this folder's manifests (and the operator's RBAC from
// config/rbac) as `kubectl apply -f` would, and then acts as the agent: with
// service-account tokens from the TokenRequest API, bound to Pods on two
// Nodes, and sent without the admin's client certificate.
var (
	testScheme     *runtime.Scheme
	testEnv        *envtest.Environment
	adminConfig    *rest.Config
	admin          client.Client
	adminClientset kubernetes.Interface

	// The identities the tests act as, set by TestMain.
	monitorA         *identity // gpuhealth-monitor, token bound to a Pod on node-a
	monitorB         *identity // gpuhealth-monitor, token bound to a Pod on node-b
	monitorUnbound   *identity // gpuhealth-monitor, token bound to no Pod
	monitorElsewhere *identity // a gpuhealth-monitor installed in another namespace, Pod on node-a
	monitorLong      *identity // gpuhealth-monitor, token bound to a Pod on longNode
	operatorA        *identity // gpuhealth-operator, token bound to a Pod on node-a
	adminIdentity    *identity // envtest's admin (client certificate, system:masters)
)

const (
	monitorNamespace  = "gpuhealth-system"
	otherNamespace    = "gpuhealth-canary"
	driverNamespace   = "nvidia-dra-driver-gpu"
	monitorSA         = "gpuhealth-monitor"
	operatorSA        = "gpuhealth-operator"
	policyName        = "gpuhealth-monitor-own-node"
	nodeA             = "node-a"
	nodeB             = "node-b"
	nodeNameExtra     = "authentication.kubernetes.io/node-name"
	monitorUser       = "system:serviceaccount:gpuhealth-system:gpuhealth-monitor"
	tokenLifetimeSecs = 3600
)

// longNode is a node whose name does not fit in its events' names (249
// characters, where "-nvml-xid-<hash>" leaves 233): EventName cuts it at a
// '.', which it then drops.
var longNode = strings.Repeat("a", 62) + "." + strings.Repeat("b", 62) + "." + strings.Repeat("c", 62) + "." +
	strings.Repeat("d", 43) + "." + strings.Repeat("e", 16)

// identity is a credential the tests act with.
type identity struct {
	name      string
	config    *rest.Config
	client    client.Client
	clientset kubernetes.Interface
}

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(e *testenv.Env) error {
		testScheme, testEnv = e.Scheme, e.Environment
		return setUp(context.Background(), e.Config)
	}))
}

// setUp installs the manifests and builds the identities the tests act as.
func setUp(ctx context.Context, cfg *rest.Config) error {
	adminConfig = cfg
	var err error
	if adminIdentity, err = newIdentity("admin", cfg); err != nil {
		return err
	}
	admin, adminClientset = adminIdentity.client, adminIdentity.clientset

	// What the user installs first: the namespace (config/manager) and,
	// for the operator's identity, its RBAC (config/rbac).
	for _, ns := range []string{monitorNamespace, otherNamespace, driverNamespace} {
		if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return fmt.Errorf("creating namespace %s: %w", ns, err)
		}
	}
	// The DRA driver's namespace exists before config/monitor/imex is
	// applied, as its comment asks.
	for _, dir := range []string{".", "imex", filepath.Join("..", "rbac")} {
		if err := vapcheck.ApplyDir(ctx, admin, dir); err != nil {
			return err
		}
	}

	// A second installation's identity: the same ClusterRole granted to a
	// gpuhealth-monitor service account in another namespace.
	if err := admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: monitorSA, Namespace: otherNamespace}}); err != nil {
		return fmt.Errorf("creating service account %s/%s: %w", otherNamespace, monitorSA, err)
	}
	if err := admin.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "gpuhealth-monitor-" + otherNamespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: monitorSA},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: monitorSA, Namespace: otherNamespace}},
	}); err != nil {
		return fmt.Errorf("binding %s/%s: %w", otherNamespace, monitorSA, err)
	}

	for _, n := range []string{nodeA, nodeB, longNode} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"nvidia.com/gpu.present": "true"}}}
		if err := admin.Create(ctx, node); err != nil {
			return fmt.Errorf("creating node %s: %w", n, err)
		}
	}

	// The Pods the tokens are bound to. They stay for the whole suite: the
	// apiserver refuses a bound token once its Pod is gone. No kubelet runs
	// them; binding needs only the Pod object and its spec.nodeName.
	if monitorA, err = boundIdentity(ctx, "monitor on node-a", monitorNamespace, monitorSA, nodeA); err != nil {
		return err
	}
	if monitorB, err = boundIdentity(ctx, "monitor on node-b", monitorNamespace, monitorSA, nodeB); err != nil {
		return err
	}
	if monitorElsewhere, err = boundIdentity(ctx, "monitor in "+otherNamespace+" on node-a", otherNamespace, monitorSA, nodeA); err != nil {
		return err
	}
	if monitorLong, err = boundIdentity(ctx, "monitor on a node with a long name", monitorNamespace, monitorSA, longNode); err != nil {
		return err
	}
	if operatorA, err = boundIdentity(ctx, "operator on node-a", monitorNamespace, operatorSA, nodeA); err != nil {
		return err
	}
	token, err := requestToken(ctx, monitorNamespace, monitorSA, nil)
	if err != nil {
		return err
	}
	monitorUnbound, err = newIdentity("monitor with an unbound token", tokenConfig(token))
	return err
}

// boundIdentity creates a Pod of service account sa on node and returns an
// identity that authenticates with a token bound to that Pod: what the
// kubelet mounts into the agent's container.
func boundIdentity(ctx context.Context, name, namespace, sa, node string) (*identity, error) {
	podName := sa + "-" + node
	if len(podName) > 63 {
		podName = sa + "-long-node"
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName, Namespace: namespace},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: sa,
			Containers:         []corev1.Container{{Name: "main", Image: sa}},
		},
	}
	if err := admin.Create(ctx, pod); err != nil {
		return nil, fmt.Errorf("creating pod %s/%s: %w", namespace, pod.Name, err)
	}
	token, err := requestToken(ctx, namespace, sa, pod)
	if err != nil {
		return nil, err
	}
	return newIdentity(name, tokenConfig(token))
}

// requestToken asks the TokenRequest API for a token of sa, bound to pod
// when pod is not nil.
func requestToken(ctx context.Context, namespace, sa string, pod *corev1.Pod) (string, error) {
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To[int64](tokenLifetimeSecs),
	}}
	if pod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID,
		}
	}
	tr, err := adminClientset.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token for %s/%s: %w", namespace, sa, err)
	}
	return tr.Status.Token, nil
}

// tokenConfig is the admin's connection (host and CA) with the token as the
// only credential. A config that also carried the admin's client certificate
// would authenticate as the admin instead.
func tokenConfig(token string) *rest.Config {
	cfg := rest.AnonymousClientConfig(adminConfig)
	cfg.BearerToken = token
	return cfg
}

func newIdentity(name string, cfg *rest.Config) (*identity, error) {
	c, err := client.New(cfg, client.Options{Scheme: testScheme})
	if err != nil {
		return nil, fmt.Errorf("creating a client for %s: %w", name, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating a clientset for %s: %w", name, err)
	}
	return &identity{name: name, config: cfg, client: c, clientset: cs}, nil
}
