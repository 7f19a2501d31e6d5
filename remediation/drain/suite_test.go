package drain_test

import (
	"fmt"
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// The drain suite talks to a real kube-apiserver and etcd (envtest), so the
// Eviction API enforces PodDisruptionBudgets and UID preconditions as it does
// in a cluster. Nothing else runs: the tests play the kubelet (removing
// terminating pods) and the disruption controller (writing PDB status).
var (
	testScheme = runtime.NewScheme()
	k8sClient  client.Client
)

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		fmt.Fprintln(os.Stderr, "KUBEBUILDER_ASSETS is not set: run 'make test', or export KUBEBUILDER_ASSETS=$(hack/controlplane.sh | tail -1)")
		return 1
	}
	if err := clientgoscheme.AddToScheme(testScheme); err != nil {
		panic(err)
	}
	if err := gpuhealthv1alpha1.AddToScheme(testScheme); err != nil {
		panic(err)
	}
	// No CRDs: the Drainer only touches built-in kinds.
	env := &envtest.Environment{Scheme: testScheme}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting envtest: %v\n", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
		}
	}()
	k8sClient, err = client.New(cfg, client.Options{Scheme: testScheme})
	if err != nil {
		fmt.Fprintf(os.Stderr, "creating client: %v\n", err)
		return 1
	}
	return m.Run()
}
