//go:build e2enode

package realnode

import (
	"testing"

	"github.com/gpuhealth/gpuhealth/e2e/framework"
)

// cases is the real-node tier, in the order it runs against the one
// installation TestMain sets up. After names what a case reads of earlier
// cases' results, and the disruptive case, which uninstalls the product,
// comes last (framework.Cases.Check refuses any other order).
var cases = framework.Cases{
	{Name: "Installed", Run: testInstalled},
	{Name: "KernelLogXID", Run: testKernelLogXID},
	{Name: "XIDCycle", Run: testXIDCycle},
	{Name: "LeaderFailover", Run: testLeaderFailover},
	{Name: "BudgetAcrossRealAndFakeNodes", Run: testBudgetAcrossRealAndFakeNodes},
	// It expects the monitor's container to have restarted exactly once,
	// by its hand: Installed saw it never restart before. (Installed, run
	// after it, would see the restart.)
	{Name: "MonitorRestartDuringOutage", Run: testMonitorRestartDuringOutage, After: []string{"Installed"}},
	{Name: "CertifyOnRequest", Run: testCertifyOnRequest},
	{Name: "StepThatCannotRunIsNotRun", Run: testStepThatCannotRunIsNotRun},
	{Name: "RecertificationFailsOnLowBandwidth", Run: testRecertificationFailsOnLowBandwidth},
	// helm uninstall. Before, the upgrade must keep the findings that
	// earlier cases made: it expects at least one, KernelLogXID's.
	{Name: "HelmUpgradeAndUninstall", Run: testHelmUpgradeAndUninstall, After: []string{"KernelLogXID"}, Disruptive: true},
}

// TestRealNode runs the tier's cases in their order; `go test -tags
// e2enode -run 'TestRealNode/^XIDCycle$' ./e2e/realnode/` runs one (a case
// that reads earlier cases' results is then skipped, and says what to run
// with it).
func TestRealNode(t *testing.T) {
	cases.Run(t)
}
