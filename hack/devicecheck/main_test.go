package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors/fakenvml"
	"github.com/gpuhealth/gpuhealth/monitors/nvml"
)

// The tests below load the fake NVML library, which is one per process:
// they run one after another, never in parallel.

const gpus = 8

func uuid(i int) string { return fmt.Sprintf("GPU-00000000-%04x-4000-8000-%012x", i, i) }

// healthyScenario is e2e/framework's Scenario: eight idle H200s with 18
// NVLinks each and a healthy fabric, clocks gpu_idle and the PCIe links
// down to generation 1 as idle GPUs' are; plus the memory, replay and
// NVLink speed groups, so that every check reads a value.
func healthyScenario() string {
	var b strings.Builder
	for d := range gpus {
		fmt.Fprintf(&b, "device index=%d uuid=%s pci=0000:%02x:00.0 name=\"NVIDIA H200\" links=18\n", d, uuid(d), 0x18+d*0x10)
		fmt.Fprintf(&b, "fabric device=%d state=completed health=healthy status=success clique=0 cluster=0123456789abcdef0123456789abcdef\n", d)
		fmt.Fprintf(&b, "clocks device=%d reasons=gpu_idle sm=345\nutil device=%d gpu=0\npcie device=%d gen=1\ntemp device=%d gpu=31 slowdown=87\n", d, d, d, d)
		fmt.Fprintf(&b, "remap device=%d\nretired device=%d pending=no\necc device=%d value=0\npcireplay device=%d value=0\nnvlinkspeed device=%d link=0 mbps=26562\n", d, d, d, d, d)
	}
	return b.String()
}

// line is any output line; each kind fills its own fields.
type line struct {
	Kind string `json:"kind"`
	// reading (and finding: Check)
	Poll   int               `json:"poll"`
	GPU    *int              `json:"gpu"`
	UUID   string            `json:"uuid"`
	Check  string            `json:"check"`
	Values json.RawMessage   `json:"values"`
	Errors map[string]string `json:"errors"`
	// finding
	Source       string                      `json:"source"`
	Component    gpuhealthv1alpha1.Component `json:"component"`
	Code         string                      `json:"code"`
	Severity     string                      `json:"severity"`
	ClassifiedBy string                      `json:"classifiedBy"`
	Resolved     bool                        `json:"resolved"`
	// timing
	Call     string `json:"call"`
	Count    int    `json:"count"`
	MinNs    int64  `json:"minNs"`
	MedianNs int64  `json:"medianNs"`
	MaxNs    int64  `json:"maxNs"`
	// summary
	Result     string `json:"result"`
	ExitStatus int    `json:"exitStatus"`
	GPUs       int    `json:"gpus"`
	Polls      int    `json:"polls"`
	Findings   int    `json:"findings"`
	NVMLCalls  int    `json:"nvmlCalls"`
	NVML       string `json:"nvml"`
}

type result struct {
	status int
	lines  []line
	stderr string
}

func (r *result) of(kind string) []line {
	var out []line
	for _, l := range r.lines {
		if l.Kind == kind {
			out = append(out, l)
		}
	}
	return out
}

// check runs the command for 3 s with a 1 s poll against the fake library
// and scenario, with the slow-GPU and NVLink windows shortened to 2 s so
// that their judges judge within the run.
func check(t *testing.T, lib, scenario string, args ...string) result {
	t.Helper()
	g := NewWithT(t)
	dir := t.TempDir()
	sc, cfg := filepath.Join(dir, "scenario.txt"), filepath.Join(dir, "monitor.yaml")
	g.Expect(os.WriteFile(sc, []byte(scenario), 0o600)).To(Succeed())
	g.Expect(os.WriteFile(cfg, []byte("nvml:\n  window: 2s\n  performance:\n    window: 2s\n"), 0o600)).To(Succeed())
	t.Setenv(fakenvml.ScenarioEnv, sc)
	o, err := parseFlags(append([]string{"--nvml-library", lib, "--config", cfg, "--duration", "3s", "--poll", "1s", "--dcgm", "off", "--pci-scan=false"}, args...), io.Discard)
	g.Expect(err).NotTo(HaveOccurred())
	var stdout, stderr bytes.Buffer
	r := result{status: run(context.Background(), o, &stdout, &stderr), stderr: stderr.String()}
	scan := bufio.NewScanner(&stdout)
	scan.Buffer(nil, 1<<20)
	for scan.Scan() {
		var l line
		g.Expect(json.Unmarshal(scan.Bytes(), &l)).To(Succeed(), scan.Text())
		r.lines = append(r.lines, l)
	}
	g.Expect(r.lines).NotTo(BeEmpty())
	g.Expect(r.lines[len(r.lines)-1].Kind).To(Equal(kindSummary), "the summary is the last line")
	return r
}

func buildFake(t *testing.T) string {
	t.Helper()
	lib, err := fakenvml.Build(t.TempDir())
	if err != nil {
		t.Fatalf("building the fake NVML library: %v", err)
	}
	return lib
}

func TestHealthyIdleNodePasses(t *testing.T) {
	g := NewWithT(t)
	r := check(t, buildFake(t), healthyScenario())

	sum := r.of(kindSummary)[0]
	g.Expect(r.status).To(Equal(exitPass), r.stderr)
	g.Expect(sum.Result).To(Equal(resultPass))
	g.Expect(sum.Findings).To(BeZero())
	g.Expect(sum.GPUs).To(Equal(gpus))
	g.Expect(sum.Polls).To(BeNumerically(">=", 2))
	g.Expect(r.stderr).To(ContainSubstring("PASS"))

	// No finding at all: the idle GPUs' PCIe links at generation 1 and
	// their gpu_idle clocks are what idle GPUs do.
	g.Expect(r.of(kindFinding)).To(BeEmpty(), r.stderr)

	// Every check of every GPU at every poll, each with its values and
	// without a failed call; the driver once a poll.
	readings := map[string]int{}
	for _, l := range r.of(kindReading) {
		g.Expect(l.Errors).To(BeEmpty(), "%s of GPU %v", l.Check, l.GPU)
		g.Expect(l.Values).NotTo(BeEmpty(), "%s of GPU %v", l.Check, l.GPU)
		key := l.Check
		if l.GPU != nil {
			g.Expect(l.UUID).To(Equal(uuid(*l.GPU)))
			key = fmt.Sprintf("%d/%s", *l.GPU, l.Check)
		}
		readings[key]++
	}
	want := map[string]int{checkDriver: sum.Polls}
	for d := range gpus {
		for _, rd := range gpuReaders {
			want[fmt.Sprintf("%d/%s", d, rd.check)] = sum.Polls
		}
	}
	g.Expect(readings).To(Equal(want))

	// What GPU 5 read at the start.
	values := map[string]json.RawMessage{}
	for _, l := range r.of(kindReading) {
		if l.Poll == 0 && l.GPU != nil && *l.GPU == 5 {
			values[l.Check] = l.Values
		}
	}
	var (
		inv    gpuhealthv1alpha1.GPUInventory
		fabric fabricValues
		links  nvlinkValues
		errs   nvlinkErrorValues
		clocks clocksValues
		pcie   pcieValues
		temp   temperatureValues
	)
	for check, into := range map[string]any{checkInventory: &inv, checkFabric: &fabric, checkNVLink: &links, checkNVLinkErrors: &errs, checkClocks: &clocks, checkPCIe: &pcie, checkTemperature: &temp} {
		g.Expect(json.Unmarshal(values[check], into)).To(Succeed(), check)
	}
	g.Expect(inv).To(Equal(gpuhealthv1alpha1.GPUInventory{
		Index: 5, UUID: uuid(5), PCIBusID: "0000:68:00.0", Product: "NVIDIA H200", VBIOS: inv.VBIOS, InfoROM: inv.InfoROM,
		ECC: "Enabled", Persistence: "Enabled", MIG: "Disabled", PowerLimitWatts: inv.PowerLimitWatts,
	}))
	g.Expect(fabric.State).To(Equal("completed"))
	g.Expect(fabric.HealthSummary).To(Equal("healthy"))
	g.Expect(fabric.Call).To(Equal(symGpuFabricInfoV))
	g.Expect(fabric.ClusterUUID).To(Equal("01234567-89ab-cdef-0123-456789abcdef"))
	g.Expect(links.Up).To(Equal(18))
	g.Expect(links.Links).To(HaveLen(18))
	for _, l := range links.Links {
		g.Expect(l.SpeedMBps).To(HaveValue(Equal(uint64(26562))), "link %d", l.Link)
	}
	g.Expect(errs.Links).To(HaveLen(18))
	g.Expect(errs.Links[17].Counters).To(Equal(map[nvml.Counter]uint64{"CRC_FLIT": 0, "CRC_DATA": 0, "REPLAY": 0, "RECOVERY": 0}))
	g.Expect(clocks.ReasonNames).To(Equal([]string{"gpu_idle"}))
	g.Expect(clocks.SMMHz).To(HaveValue(Equal(uint32(345))))
	g.Expect(pcie.Generation).To(HaveValue(Equal(1)))
	g.Expect(pcie.MaxGeneration).To(HaveValue(Equal(5)))
	g.Expect(pcie.Width).To(HaveValue(Equal(16)))
	g.Expect(temp.GPUC).To(HaveValue(Equal(uint32(31))))
	g.Expect(temp.SlowdownC).To(HaveValue(Equal(uint32(87))))

	// A timing line for each NVML function called, and no other: the
	// functions the agent calls, the optional ones only where the library
	// has them (the fake has all three).
	calls := map[string]int{}
	total := 0
	for _, l := range r.of(kindTiming) {
		g.Expect(l.MinNs).To(BeNumerically(">", 0), l.Call)
		g.Expect(l.MinNs).To(BeNumerically("<=", l.MedianNs), l.Call)
		g.Expect(l.MedianNs).To(BeNumerically("<=", l.MaxNs), l.Call)
		calls[l.Call] = l.Count
		total += l.Count
	}
	g.Expect(sum.NVMLCalls).To(Equal(total))
	names := make([]string, 0, len(calls))
	for n := range calls {
		names = append(names, n)
	}
	slices.Sort(names)
	g.Expect(names).To(Equal([]string{
		"nvmlDeviceGetClockInfo", "nvmlDeviceGetCount_v2", "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
		"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetEccMode", "nvmlDeviceGetFieldValues", "nvmlDeviceGetGpuFabricInfoV",
		"nvmlDeviceGetGpuMaxPcieLinkGeneration", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetInforomImageVersion",
		"nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetMigMode",
		"nvmlDeviceGetName", "nvmlDeviceGetNvLinkErrorCounter", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetPciInfo_v3",
		"nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetPersistenceMode", "nvmlDeviceGetPowerManagementLimit",
		"nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetTemperature",
		"nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetUUID", "nvmlDeviceGetUtilizationRates",
		"nvmlDeviceGetVbiosVersion", "nvmlDeviceGetViolationStatus", "nvmlInit_v2", "nvmlShutdown",
		"nvmlSystemGetCudaDriverVersion", "nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion",
	}))
	g.Expect(calls["nvmlDeviceGetGpuFabricInfoV"]).To(Equal(gpus * sum.Polls))
	g.Expect(calls["nvmlDeviceGetNvLinkErrorCounter"]).To(Equal(gpus * 18 * 4 * sum.Polls))
}

func TestXIDFails(t *testing.T) {
	g := NewWithT(t)
	// XID 79, the GPU fell off the bus, on GPU 3 after the source has
	// registered for events (the fake delivers XIDs raised after that).
	r := check(t, buildFake(t), healthyScenario()+"xid device=3 code=79 at=1500ms\n", "--duration", "2500ms")

	g.Expect(r.status).To(Equal(exitFail), r.stderr)
	sum := r.of(kindSummary)[0]
	g.Expect(sum.Result).To(Equal(resultFail))
	g.Expect(sum.ExitStatus).To(Equal(exitFail))
	g.Expect(sum.Findings).To(BeNumerically(">=", 1))
	g.Expect(r.of(kindFinding)).To(ContainElement(And(
		HaveField("Source", "nvml"), HaveField("Check", "XID"), HaveField("Code", "79"),
		HaveField("Component.ID", uuid(3)), HaveField("Resolved", false),
		HaveField("Severity", Not(BeEmpty())), HaveField("ClassifiedBy", "xid catalog"),
	)))
	g.Expect(r.stderr).To(ContainSubstring("FAIL"))
}

func TestNoNVMLExits2(t *testing.T) {
	g := NewWithT(t)
	r := check(t, filepath.Join(t.TempDir(), "libnvidia-ml.so.1"), "")

	g.Expect(r.status).To(Equal(exitNoNVML))
	g.Expect(r.lines).To(HaveLen(2), "the timing of nvmlInit and the summary")
	sum := r.of(kindSummary)[0]
	g.Expect(sum.Result).To(Equal(resultUnavailable))
	g.Expect(sum.ExitStatus).To(Equal(exitNoNVML))
	g.Expect(sum.NVML).To(HavePrefix("cannot initialise: "))
	g.Expect(r.stderr).To(ContainSubstring("NVML cannot be initialised"))
}

// TestOptionalSymbolsAreTheAgents checks that every function the readings
// call only after a look-up is one the agent looks up too.
func TestOptionalSymbolsAreTheAgents(t *testing.T) {
	g := NewWithT(t)
	for _, s := range []string{symClocksEventReasons, symGpuMaxPcieLinkGeneration, symGpuFabricInfoV} {
		g.Expect(nvml.OptionalSymbols).To(ContainElement(s))
	}
}

func TestParseFlags(t *testing.T) {
	cases := []struct {
		name string
		args []string
		ok   bool
	}{
		{name: "no flag takes the defaults", ok: true},
		{name: "every flag set", args: []string{"--duration", "5s", "--poll", "1s", "--nvml-library", "/x", "--config", "c", "--dcgm", "on", "--pci-scan=false"}, ok: true},
		{name: "a zero duration is refused", args: []string{"--duration", "0s"}},
		{name: "a negative poll is refused", args: []string{"--poll", "-1s"}},
		{name: "an unknown DCGM mode is refused", args: []string{"--dcgm", "maybe"}},
		{name: "a stray argument is refused", args: []string{"now"}},
		{name: "an unknown flag is refused", args: []string{"--verbose"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			o, err := parseFlags(tc.args, io.Discard)
			if !tc.ok {
				g.Expect(err).To(HaveOccurred())
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(o.duration).To(BeNumerically(">", 0))
		})
	}
}

func TestReasonNames(t *testing.T) {
	cases := []struct {
		name    string
		reasons uint64
		want    []string
	}{
		{name: "no reason names nothing", reasons: 0, want: nil},
		{name: "an idle GPU", reasons: 0x1, want: []string{"gpu_idle"}},
		{name: "thermal slowdowns", reasons: 0x20 | 0x40, want: []string{"sw_thermal", "hw_thermal"}},
		{name: "an unknown bit is written in hex", reasons: 0x4 | 0x8000, want: []string{"sw_power_cap", "0x8000"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			NewWithT(t).Expect(reasonNames(tc.reasons)).To(Equal(tc.want))
		})
	}
}
