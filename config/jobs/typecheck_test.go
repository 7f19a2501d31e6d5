package jobs_test

import (
	"testing"

	"github.com/gpuhealth/gpuhealth/internal/test/vapcheck"
)

// The policy's CEL, checked against the schemas it reads as
// kube-controller-manager checks it, with a misspelt copy as the negative
// control.
func TestPolicyTypeChecksAgainstTheCRDSchema(t *testing.T) {
	vapcheck.TypeChecks(t, testEnv, admin, manifest, "gpuhealth.dev/v1alpha1",
		vapcheck.Misspelling{Field: "serviceAccountName", Misspelt: "serviceAcountName", Warned: "serviceAcountName"})
}
