package pipeline

import (
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
)

var (
	testScheme *runtime.Scheme
	restConfig *rest.Config
	// admin is a client with the envtest admin's rights, for assertions.
	admin client.Client
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(e *testenv.Env) error {
		testScheme, restConfig, admin = e.Scheme, e.Config, e.Client
		// The machine is shared with builds: be patient, but bounded.
		SetDefaultEventuallyTimeout(10 * time.Second)
		SetDefaultEventuallyPollingInterval(20 * time.Millisecond)
		return nil
	}))
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
