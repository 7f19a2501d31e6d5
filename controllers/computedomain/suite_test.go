package computedomain

import (
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
)

var (
	testScheme *runtime.Scheme
	k8sClient  client.Client
	testEnv    *envtest.Environment
)

// The suite starts without the ComputeDomain CRDs: a cluster without
// NVIDIA's driver is the case the view must handle first. Tests install
// them in each driver shape (testenv.DriverShapes).

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(e *testenv.Env) error {
		testScheme, k8sClient, testEnv = e.Scheme, e.Client, e.Environment
		return nil
	}))
}
