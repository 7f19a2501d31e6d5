package node_test

import (
	"os"
	"testing"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
)

// The tests talk to a real kube-apiserver and etcd (envtest), so merge
// patches, the optimistic lock on resourceVersion, the status subresource
// and managedFields behave as in a cluster. Nothing else runs: no kubelet or
// node controller writes the Nodes the tests create.
var (
	k8sClient client.Client
	// watchClient is the same admin client as a client.WithWatch, for
	// wrapping in an interceptor.
	watchClient client.WithWatch
	// restConfig is the admin's, for clients with a User-Agent of their own.
	restConfig *rest.Config
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(e *testenv.Env) error {
		k8sClient, restConfig = e.Client, e.Config
		var err error
		watchClient, err = client.NewWithWatch(e.Config, client.Options{Scheme: e.Scheme})
		return err
	}))
}
