package devicetaint_test

import (
	"flag"
	"os"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
)

var k8sClient client.Client

func TestMain(m *testing.M) {
	flag.Parse()
	if fuzzing() {
		// make fuzz runs no envtest test: no control plane for it, nor
		// for each of its workers.
		os.Exit(m.Run())
	}
	os.Exit(testenv.Main(m, func(e *testenv.Env) error {
		k8sClient = e.Client
		return nil
	}))
}

// fuzzing says whether this binary fuzzes (or is a fuzz worker).
func fuzzing() bool {
	f, w := flag.Lookup("test.fuzz"), flag.Lookup("test.fuzzworker")
	return f != nil && f.Value.String() != "" || w != nil && w.Value.String() == "true"
}
