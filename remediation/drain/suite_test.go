package drain_test

import (
	"os"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
)

// The drain suite talks to a real kube-apiserver and etcd (envtest), so the
// Eviction API enforces PodDisruptionBudgets and UID preconditions as it does
// in a cluster. Nothing else runs: the tests play the kubelet (removing
// terminating pods) and the disruption controller (writing PDB status).
var k8sClient client.WithWatch

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(e *testenv.Env) error {
		k8sClient = e.Client
		return nil
	}))
}
