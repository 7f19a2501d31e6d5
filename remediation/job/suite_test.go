package job_test

import (
	"os"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
)

// The DeleteUnfinished tests talk to a real kube-apiserver and etcd
// (envtest), so delete preconditions and propagation policies are enforced
// as in a cluster. No controller runs: the tests write the Jobs' status, and
// without a garbage collector a Job deleted with any policy but background
// stays behind with an orphan or foregroundDeletion finalizer.
var (
	k8sClient client.Client
	// watchClient is the same admin client as a client.WithWatch, for
	// wrapping in an interceptor.
	watchClient client.WithWatch
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(e *testenv.Env) error {
		k8sClient = e.Client
		var err error
		watchClient, err = client.NewWithWatch(e.Config, client.Options{Scheme: e.Scheme})
		return err
	}))
}
