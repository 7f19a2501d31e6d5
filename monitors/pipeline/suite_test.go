package pipeline

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

var (
	testScheme = runtime.NewScheme()
	restConfig *rest.Config
	// admin is a client with the envtest admin's rights, for assertions.
	admin client.Client
)

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		fmt.Fprintln(os.Stderr, "KUBEBUILDER_ASSETS is not set: run 'make test', or export KUBEBUILDER_ASSETS=$(hack/controlplane.sh | tail -1)")
		return 1
	}
	ctrl.SetLogger(logr.Discard())
	if err := gpuhealthv1alpha1.AddToScheme(testScheme); err != nil {
		panic(err)
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd")},
		ErrorIfCRDPathMissing: true,
		Scheme:                testScheme,
	}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting envtest: %v\n", err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	restConfig = cfg
	if admin, err = client.New(cfg, client.Options{Scheme: testScheme}); err != nil {
		fmt.Fprintf(os.Stderr, "creating client: %v\n", err)
		return 1
	}
	// The machine is shared with builds: be patient, but bounded.
	SetDefaultEventuallyTimeout(10 * time.Second)
	SetDefaultEventuallyPollingInterval(20 * time.Millisecond)
	return m.Run()
}

// countingClient returns a client whose writes (anything but GET) are counted.
func countingClient(t *testing.T, cfg *rest.Config) (client.Client, *atomic.Int64) {
	t.Helper()
	var writes atomic.Int64
	c := rest.CopyConfig(cfg)
	c.QPS, c.Burst = 1000, 1000
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			if r.Method != http.MethodGet {
				writes.Add(1)
			}
			return rt.RoundTrip(r)
		})
	}
	cl, err := client.New(c, client.Options{Scheme: testScheme})
	if err != nil {
		t.Fatal(err)
	}
	return cl, &writes
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
