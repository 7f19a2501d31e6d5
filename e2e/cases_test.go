//go:build e2e

package e2e

import (
	"testing"

	. "github.com/onsi/gomega"

	"github.com/gpuhealth/gpuhealth/e2e/framework"
)

// cases is the suite, in the order it runs against the one installation
// TestMain sets up. Each case works on nodes of its own or waits for the
// nodes it shares to be Healthy; After names what a case reads of earlier
// cases' results, and the disruptive cases, which take the installation
// away, come last (framework.Cases.Check refuses any other order).
//
// Three cases count the Jobs of their node and expect only their own: the
// ones on the node before them must be gone. XID79FullCycle (gpu-node-0)
// runs before FabricFaultTaintsTheClique recertifies gpu-node-0;
// RecertificationFailsTwice (gpu-node-2) before BudgetDrainsOneAtATime and
// HandOffs; OperatorKilledMidDrain (gpu-node-3) before
// BudgetDrainsOneAtATime and after ComputeDomains, whose cleanup deletes
// the Jobs of gpu-node-0 to -3, among them the recertification
// CliqueCertificationGatesTheFabricTaint caused on gpu-node-3.
var cases = framework.Cases{
	{Name: "NewNodeHeldOutUntilCertified", Run: testNewNodeHeldOutUntilCertified},
	{Name: "GangDrainStopsTheJob", Run: testGangDrainStopsTheJob},
	{Name: "StackDriftAndMissingGPU", Run: testStackDriftAndMissingGPU},
	{Name: "NICPortDownCycle", Run: testNICPortDownCycle},
	{Name: "DeviceQuarantineOneGPU", Run: testDeviceQuarantineOneGPU},
	{Name: "CliqueCertificationGatesTheFabricTaint", Run: testCliqueCertificationGatesTheFabricTaint},
	{Name: "ComputeDomains", Run: testComputeDomains},
	{Name: "XID79FullCycle", Run: testXID79FullCycle},
	{Name: "NVLinkCRCBurst", Run: testNVLinkCRCBurst},
	{Name: "RecertificationFailsTwice", Run: testRecertificationFailsTwice},
	// It restarts the operator: the counters the metric cases read start
	// again here (and maybe in MonitorRestartDuringOutage, whose outage may
	// cost the operator its Lease).
	{Name: "OperatorKilledMidDrain", Run: testOperatorKilledMidDrain},
	{Name: "MonitorRestartDuringOutage", Run: testMonitorRestartDuringOutage},
	{Name: "MonitorMayOnlyWriteItsOwnNode", Run: testMonitorMayOnlyWriteItsOwnNode},
	{Name: "BudgetDrainsOneAtATime", Run: testBudgetDrainsOneAtATime},
	{Name: "BadInputIsRejected", Run: testBadInputIsRejected},
	{Name: "PolicyEditorCannotEscalate", Run: testPolicyEditorCannotEscalate},
	{Name: "FabricFaultTaintsTheClique", Run: testFabricFaultTaintsTheClique},
	{Name: "MaintenanceDrainedUnderBudgetAndReturned", Run: testMaintenanceDrainedUnderBudgetAndReturned},
	{Name: "HandOffs", Run: testHandOffs},
	// The operator's histograms since its last restart: the RebootNode
	// repairs recertified after it (OperatorKilledMidDrain's, then
	// BudgetDrainsOneAtATime's three), the one HandOffs failed, the
	// Maintenance phase and the time between two XIDs on a node. The
	// earlier cycles (XID79FullCycle's among them) were counted by the
	// operator that was killed.
	{Name: "RepairMetricsAfterTheCycles", Run: testRepairMetricsAfterTheCycles,
		After: []string{"OperatorKilledMidDrain", "BudgetDrainsOneAtATime", "MaintenanceDrainedUnderBudgetAndReturned", "HandOffs"}},
	{Name: "ThrottledGPUCycle", Run: testThrottledGPUCycle},
	// Every alert's metric and every dashboard query's data come from what
	// the cases before it made the operator and the monitors export.
	{Name: "ShippedQueriesReadTheRealMetrics", Run: testShippedQueriesReadTheRealMetrics, AfterAll: true},
	{Name: "KubectlPlugin", Run: testKubectlPlugin},
	// The image's operator takes the Lease while the suite's is stopped;
	// the one restarted after it has lost every counter.
	{Name: "ImagesRun", Run: testImagesRun, Disruptive: true},
	// helm uninstall: nothing of the product is left to test.
	{Name: "HelmUpgradeAndUninstall", Run: testHelmUpgradeAndUninstall, Disruptive: true},
}

// TestE2E runs the suite's cases in their order; `go test -tags e2e -run
// 'TestE2E/^XID79FullCycle$' ./e2e/` runs one (a case that reads earlier
// cases' results is then skipped, and says what to run with it).
func TestE2E(t *testing.T) {
	cases.Run(t)
}

// TestCaseOrder: framework.Cases.Check refuses a list that cannot run in
// its order, and accepts this suite's.
func TestCaseOrder(t *testing.T) {
	body := func(*testing.T) {}
	for _, tc := range []struct {
		name  string
		cases framework.Cases
		// err is a part of Check's error; "" when the list is in order.
		err string
	}{
		{name: "the suite's list is in order", cases: cases},
		{name: "disruptive cases last, each after what it reads", cases: framework.Cases{
			{Name: "cycle", Run: body},
			{Name: "metrics", Run: body, After: []string{"cycle"}},
			{Name: "queries", Run: body, AfterAll: true},
			{Name: "images", Run: body, Disruptive: true},
			{Name: "uninstall", Run: body, After: []string{"cycle"}, Disruptive: true},
		}},
		{name: "a case after a disruptive one is refused", cases: framework.Cases{
			{Name: "uninstall", Run: body, Disruptive: true},
			{Name: "cycle", Run: body},
		}, err: "case cycle follows uninstall, which is disruptive"},
		{name: "a case listed before what it reads is refused", cases: framework.Cases{
			{Name: "metrics", Run: body, After: []string{"cycle"}},
			{Name: "cycle", Run: body},
		}, err: "case metrics reads what cycle left, but cycle is not listed before it"},
		{name: "a case that reads itself is refused", cases: framework.Cases{
			{Name: "cycle", Run: body, After: []string{"cycle"}},
		}, err: "cycle is not listed before it"},
		{name: "a case that reads an unknown one is refused", cases: framework.Cases{
			{Name: "metrics", Run: body, After: []string{"cylce"}},
		}, err: "no case is named cylce"},
		{name: "a name listed twice is refused", cases: framework.Cases{
			{Name: "cycle", Run: body},
			{Name: "cycle", Run: body},
		}, err: "case cycle is listed twice"},
		{name: "a name -run cannot match as written is refused", cases: framework.Cases{
			{Name: "full cycle", Run: body},
		}, err: `name "full cycle" is not one -run matches`},
		{name: "a case without a body is refused", cases: framework.Cases{
			{Name: "cycle"},
		}, err: "case cycle has no body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			err := tc.cases.Check()
			if tc.err == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(MatchError(ContainSubstring(tc.err)))
		})
	}
}

// TestCaseRunsAfterWhatItReads: framework.Cases.Run runs a case only when
// every case it reads from passed before it, and skips it otherwise.
func TestCaseRunsAfterWhatItReads(t *testing.T) {
	var ran []string
	record := func(name string) func(*testing.T) {
		return func(*testing.T) { ran = append(ran, name) }
	}
	framework.Cases{
		{Name: "skipped", Run: (*testing.T).SkipNow},
		{Name: "passes", Run: record("passes")},
		{Name: "readsPasses", Run: record("readsPasses"), After: []string{"passes"}},
		{Name: "readsSkipped", Run: record("readsSkipped"), After: []string{"passes", "skipped"}},
		{Name: "readsReadsSkipped", Run: record("readsReadsSkipped"), After: []string{"readsSkipped"}},
		{Name: "readsAll", Run: record("readsAll"), AfterAll: true},
	}.Run(t)
	NewWithT(t).Expect(ran).To(Equal([]string{"passes", "readsPasses"}))
}
