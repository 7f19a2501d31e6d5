package dcgm

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// Short names for the expectations below.
const (
	fatal     = gpuhealthv1alpha1.SeverityFatal
	degraded  = gpuhealthv1alpha1.SeverityDegraded
	reset     = gpuhealthv1alpha1.ActionResetGPU
	reboot    = gpuhealthv1alpha1.ActionRebootNode
	recertify = gpuhealthv1alpha1.ActionRecertify
	support   = gpuhealthv1alpha1.ActionContactSupport
	noAction  = gpuhealthv1alpha1.ActionNone
)

var (
	gpu0     = Entity{Kind: EntityGPU, ID: 0}
	switch2  = Entity{Kind: EntitySwitch, ID: 2}
	global   = Entity{Kind: EntityNone}
	onGPU0   = gpuComponent("GPU-aaaa")
	onSwitch = gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVSwitch, ID: "nvswitch-2"}
	onDaemon = gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentIMEX, ID: "daemon"}
	onDomain = gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentIMEX, ID: "domain"}
)

// healthCode is one DCGM health error code as NVIDIA defines it
// (dcgmError_t in dcgm_errors.h, priority from dcgmErrorMeta in
// dcgm_errors.c), an incident DCGM's health watch would report with it (the
// message follows the code's DCGM_FR_*_MSG format), and the finding
// gpuhealth should make of it.
type healthCode struct {
	code     uint
	name     string
	priority string
	incident Incident
	// check is the expected finding's check; empty: not reported.
	check     gpuhealthv1alpha1.Check
	component gpuhealthv1alpha1.Component
	// findingCode is the expected finding's code; empty: name.
	findingCode string
	severity    gpuhealthv1alpha1.Severity
	action      gpuhealthv1alpha1.Action
	// once says DCGM only raises the code from an XID, so the condition is
	// not repeated.
	once bool
}

// healthCodes lists every code the source's table maps, written out here
// from NVIDIA's headers rather than taken from incidentRules.
var healthCodes = []healthCode{
	{code: 3, name: "DCGM_FR_PCI_REPLAY_RATE", priority: "ISOLATE",
		incident: Incident{Message: "Detected more than 8 PCIe replays per minute for GPU 0 : 12", Entity: gpu0, Health: HealthWarn},
		check:    gpuhealthv1alpha1.CheckPCIe, component: onGPU0, severity: degraded, action: recertify},
	{code: 4, name: "DCGM_FR_VOLATILE_DBE_DETECTED", priority: "ISOLATE",
		incident: Incident{Message: "Detected 2 volatile double-bit ECC error(s) in GPU 0.", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckECC, component: onGPU0, severity: fatal, action: reset},
	{code: 5, name: "DCGM_FR_VOLATILE_SBE_DETECTED", priority: "MONITOR",
		incident: Incident{Message: "More than 10 single-bit ECC error(s) detected in GPU 0 Volatile SBEs: 12", Entity: gpu0, Health: HealthWarn},
		check:    gpuhealthv1alpha1.CheckECC, component: onGPU0, severity: degraded, action: recertify},
	{code: 6, name: "DCGM_FR_PENDING_PAGE_RETIREMENTS", priority: "RESET",
		incident: Incident{Message: "A pending retired page has been detected in GPU 0.", Entity: gpu0, Health: HealthWarn},
		check:    gpuhealthv1alpha1.CheckECC, component: onGPU0, severity: degraded, action: reset},
	{code: 7, name: "DCGM_FR_RETIRED_PAGES_LIMIT", priority: "ISOLATE",
		incident: Incident{Message: "60 or more retired pages have been detected in GPU 0. ", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckECC, component: onGPU0, severity: fatal, action: support},
	{code: 8, name: "DCGM_FR_RETIRED_PAGES_DBE_LIMIT", priority: "ISOLATE",
		incident: Incident{Message: "An excess of 15 retired pages due to DBEs have been detected and more than one page has been retired due to DBEs in the past week in GPU 0.", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckECC, component: onGPU0, severity: fatal, action: support},
	{code: 9, name: "DCGM_FR_CORRUPT_INFOROM", priority: "TRIAGE",
		incident: Incident{Message: "A corrupt InfoROM has been detected in GPU 0.", Entity: gpu0, Health: HealthWarn},
		check:    gpuhealthv1alpha1.CheckInfoROM, component: onGPU0, severity: degraded, action: support},
	{code: 10, name: "DCGM_FR_CLOCKS_EVENT_THERMAL", priority: "MONITOR",
		incident: Incident{Message: "Detected clocks event due to thermal violation in GPU 0.", Entity: gpu0, Health: HealthWarn},
		check:    gpuhealthv1alpha1.CheckThermal, component: onGPU0, severity: degraded, action: noAction},
	{code: 11, name: "DCGM_FR_POWER_UNREADABLE", priority: "MONITOR",
		incident: Incident{Message: "Cannot reliably read the power usage for GPU 0.", Entity: gpu0, Health: HealthWarn},
		check:    gpuhealthv1alpha1.CheckPower, component: onGPU0, severity: degraded, action: noAction},
	{code: 12, name: "DCGM_FR_CLOCKS_EVENT_POWER", priority: "MONITOR",
		incident: Incident{Message: "Detected clocks event due to power violation in GPU 0.", Entity: gpu0, Health: HealthWarn}},
	{code: 13, name: "DCGM_FR_NVLINK_ERROR_THRESHOLD", priority: "ISOLATE",
		incident: Incident{Message: "Detected 3 CRC FLIT NvLink errors on GPU 0's NVLink which exceeds threshold of 1", Entity: gpu0, Health: HealthWarn},
		check:    gpuhealthv1alpha1.CheckNVLinkErrors, component: onGPU0, severity: degraded, action: recertify},
	{code: 14, name: "DCGM_FR_NVLINK_DOWN", priority: "TRIAGE",
		incident: Incident{Message: "GPU 0's NvLink link 3 is currently down", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckNVLinkDown, component: nvlinkComponent("GPU-aaaa/link-3"), severity: degraded, action: recertify},
	{code: 15, name: "DCGM_FR_NVSWITCH_FATAL_ERROR", priority: "ISOLATE",
		incident: Incident{Message: "Detected fatal errors on NvSwitch 2 link 0", Entity: switch2, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckNVSwitch, component: onSwitch, severity: fatal, action: reboot},
	{code: 16, name: "DCGM_FR_NVSWITCH_NON_FATAL_ERROR", priority: "MONITOR",
		incident: Incident{Message: "Detected nonfatal errors on NvSwitch 2 link 0", Entity: switch2, Health: HealthWarn},
		check:    gpuhealthv1alpha1.CheckNVSwitch, component: onSwitch, severity: degraded, action: recertify},
	{code: 17, name: "DCGM_FR_NVSWITCH_DOWN", priority: "MONITOR",
		incident: Incident{Message: "NvSwitch physical ID 2's NvLink port 5 is currently down.", Entity: switch2, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckNVLinkDown, component: nvlinkComponent("nvswitch-2/link-5"), severity: degraded, action: recertify},
	{code: 33, name: "DCGM_FR_FIELD_VIOLATION", priority: "ISOLATE",
		incident: Incident{Message: "Detected 2 Fabric Health: Route Unhealthy for GPU 0 Route Unhealthy", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckFabric, component: onGPU0, severity: fatal, action: recertify},
	{code: 40, name: "DCGM_FR_THERMAL_VIOLATIONS", priority: "MONITOR",
		incident: Incident{Message: "There were thermal violations totaling 3.0 seconds for GPU 0", Entity: gpu0, Health: HealthWarn},
		check:    gpuhealthv1alpha1.CheckThermal, component: onGPU0, severity: degraded, action: noAction},
	{code: 41, name: "DCGM_FR_THERMAL_VIOLATIONS_TS", priority: "MONITOR",
		incident: Incident{Message: "Thermal violations totaling 3.0 seconds started at 1.0 seconds into the test for GPU 0", Entity: gpu0, Health: HealthWarn},
		check:    gpuhealthv1alpha1.CheckThermal, component: onGPU0, severity: degraded, action: noAction},
	{code: 42, name: "DCGM_FR_TEMP_VIOLATION", priority: "MONITOR",
		incident: Incident{Message: "Temperature 95 of GPU 0 exceeded user-specified maximum allowed temperature 90", Entity: gpu0, Health: HealthWarn},
		check:    gpuhealthv1alpha1.CheckThermal, component: onGPU0, severity: degraded, action: noAction},
	{code: 43, name: "DCGM_FR_CLOCKS_EVENT_VIOLATION", priority: "MONITOR",
		incident: Incident{Message: "Clocks event for GPU 0 because of clocks event starting 1.0 seconds into the test. HW slowdown", Entity: gpu0, Health: HealthWarn},
		check:    gpuhealthv1alpha1.CheckThermal, component: onGPU0, severity: degraded, action: noAction},
	{code: 52, name: "DCGM_FR_FAULTY_MEMORY", priority: "ISOLATE",
		incident: Incident{Message: "Found 1 faulty memory elements on GPU 0", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckECC, component: onGPU0, severity: fatal, action: support},
	{code: 70, name: "DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD", priority: "ISOLATE",
		incident: Incident{Message: "150.0 CRC FLIT NvLink errors found per second on GPU 0, exceeding the limit of 100 per second.", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckNVLinkErrors, component: onGPU0, severity: degraded, action: recertify},
	{code: 71, name: "DCGM_FR_NVLINK_ERROR_CRITICAL", priority: "ISOLATE",
		incident: Incident{Message: "Detected 2 Replay NvLink errors on GPU 0's NVLink (should be 0)", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckNVLinkErrors, component: onGPU0, severity: fatal, action: reset},
	{code: 80, name: "DCGM_FR_ROW_REMAP_FAILURE", priority: "RESET",
		incident: Incident{Message: "GPU 0 had uncorrectable memory errors and row remapping failed.", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckECC, component: onGPU0, severity: fatal, action: reset},
	{code: 81, name: "DCGM_FR_UNCONTAINED_ERROR", priority: "ISOLATE",
		incident: Incident{Message: "GPU had an uncontained error (XID 95) (triggered by XID 95: GPU had an uncontained error (XID 95))", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckECC, component: onGPU0, severity: fatal, action: reset, once: true},
	{code: 83, name: "DCGM_FR_DBE_PENDING_PAGE_RETIREMENTS", priority: "RESET",
		incident: Incident{Message: "Pending page retirements together with a DBE were detected on GPU 0.", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckECC, component: onGPU0, severity: fatal, action: reset},
	{code: 84, name: "DCGM_FR_UNCORRECTABLE_ROW_REMAP", priority: "RESET",
		incident: Incident{Message: "GPU 0 had uncorrectable memory errors and 2 rows were remapped", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckECC, component: onGPU0, severity: fatal, action: reset},
	{code: 85, name: "DCGM_FR_PENDING_ROW_REMAP", priority: "RESET",
		incident: Incident{Message: "GPU 0 had memory errors and row remappings are pending", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckECC, component: onGPU0, severity: fatal, action: reset},
	{code: 88, name: "DCGM_FR_NVSWITCH_NVLINK_DOWN", priority: "ISOLATE",
		incident: Incident{Message: "NVSwitch 2's NvLink 7 is down.", Entity: switch2, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckNVLinkDown, component: nvlinkComponent("nvswitch-2/link-7"), severity: degraded, action: recertify},
	{code: 99, name: "DCGM_FR_GPU_EXPECTED_NVLINKS_UP", priority: "TRIAGE",
		incident: Incident{Message: "Only 16 NvLinks are up out of the expected 18", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckNVLinkDown, component: onGPU0, severity: degraded, action: recertify},
	{code: 100, name: "DCGM_FR_NVSWITCH_EXPECTED_NVLINKS_UP", priority: "TRIAGE",
		incident: Incident{Message: "NvSwitch 2 - Only 60 NvLinks are up out of the expected 64", Entity: switch2, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckNVLinkDown, component: onSwitch, severity: degraded, action: recertify},
	{code: 101, name: "DCGM_FR_XID_ERROR", priority: "TRIAGE",
		incident: Incident{Message: "Detected XID 48 for GPU 0 (triggered by XID 48: Double Bit ECC Error)", Entity: gpu0, Health: HealthFail}},
	{code: 109, name: "DCGM_FR_SXID_ERROR", priority: "ISOLATE",
		incident: Incident{Message: "Detected fatal NvSwitch SXID 12028", Entity: switch2, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckSXID, component: onSwitch, findingCode: "12028", severity: fatal, action: reboot},
	{code: 112, name: "DCGM_FR_FABRIC_MANAGER_TRAINING_ERROR", priority: "CONFIG",
		incident: Incident{Message: "Fabric Manager (Cluster UUID: 1234, Clique ID: 7, Health Mask: 0x1): training failed.", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckFabric, component: onGPU0, severity: fatal, action: recertify},
	{code: 119, name: "DCGM_FR_NVLINK_EFFECTIVE_BER_THRESHOLD", priority: "ISOLATE",
		incident: Incident{Message: "Detected effective BER 1.00e-09 exceeds minimum threshold on GPU 0's NVLink.", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckNVLinkErrors, component: onGPU0, severity: degraded, action: recertify},
	{code: 120, name: "DCGM_FR_FALLEN_OFF_BUS", priority: "ISOLATE",
		incident: Incident{Message: "GPU 0 has fallen off the bus (triggered by XID 79: GPU %d has fallen off the bus)", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckGPULost, component: onGPU0, severity: fatal, action: reboot, once: true},
	{code: 121, name: "DCGM_FR_NVLINK_SYMBOL_BER_THRESHOLD", priority: "ISOLATE",
		incident: Incident{Message: "Detected symbol BER 1.00e-12 exceeds minimum threshold on GPU 0's NVLink.", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckNVLinkErrors, component: onGPU0, severity: fatal, action: reset},
	{code: 122, name: "DCGM_FR_IMEX_UNHEALTHY", priority: "ISOLATE",
		incident: Incident{Message: "IMEX daemon status is 2 (not READY)", Entity: global, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckIMEXDaemon, component: onDaemon, severity: degraded, action: recertify},
	{code: 123, name: "DCGM_FR_FABRIC_PROBE_STATE", priority: "MONITOR",
		incident: Incident{Message: "GPU 0: Fabric State is Failed (4). Fabric Manager training failed.", Entity: gpu0, Health: HealthFail},
		check:    gpuhealthv1alpha1.CheckFabric, component: onGPU0, severity: fatal, action: recertify},
	{code: 131, name: "DCGM_FR_CONTAINED_ERROR", priority: "MONITOR",
		incident: Incident{Message: "GPU had a contained error. (triggered by XID 94: GPU had a contained error.)", Entity: gpu0, Health: HealthWarn},
		check:    gpuhealthv1alpha1.CheckECC, component: onGPU0, severity: degraded, action: reset, once: true},
	{code: 132, name: "DCGM_FR_UNCORRECTABLE_ROW_REMAP_LIMIT", priority: "TRIAGE",
		incident: Incident{Message: "GPU 0 exceeded uncorrectable row remap limit with 9 remapped rows", Entity: gpu0, Health: HealthWarn},
		check:    gpuhealthv1alpha1.CheckECC, component: onGPU0, severity: degraded, action: support},
}

// want is the finding c expects while its incident is reported.
func (c healthCode) want() monitors.Finding {
	code := c.findingCode
	if code == "" {
		code = c.name
	}
	return monitors.Finding{
		Source: gpuhealthv1alpha1.SourceDCGM, Check: c.check, Component: c.component,
		Code: code, Severity: c.severity, Action: c.action,
	}
}

// TestHealthCodes drives every code through the fake client: the finding
// when it appears, a repeat after RepeatInterval unless DCGM derives it from
// an XID, and its resolution when the check stops reporting it.
func TestHealthCodes(t *testing.T) {
	for _, c := range healthCodes {
		t.Run(fmt.Sprintf("%d %s", c.code, c.name), func(t *testing.T) {
			g := NewWithT(t)
			client := newFakeClient()
			p := newPoller(t, Source{}, client)
			in := c.incident
			in.Code = HealthCode(c.code)
			client.setIncidents(in)

			p.poll(0)
			if c.check == "" {
				g.Expect(p.rec.take()).To(BeEmpty(), "not reported")
				return
			}
			want := c.want()
			g.Expect(p.rec.take()).To(Equal([]monitors.Finding{want}))
			p.poll(poll)
			g.Expect(p.rec.take()).To(BeEmpty(), "nothing new while it holds")
			p.poll(DefaultRepeatInterval)
			if c.once {
				g.Expect(p.rec.take()).To(BeEmpty(), "DCGM keeps an XID's incident until it restarts: not repeated")
			} else {
				g.Expect(p.rec.take()).To(Equal([]monitors.Finding{want}), "repeated every RepeatInterval")
			}
			client.setIncidents()
			p.poll(poll)
			g.Expect(p.rec.take()).To(Equal([]monitors.Finding{resolved(want)}))
		})
	}
}

// TestHealthCodesAreAllTested keeps incidentRules and the list above in
// step: every mapped code is tested, under DCGM's name and priority.
func TestHealthCodesAreAllTested(t *testing.T) {
	g := NewWithT(t)
	tested := map[HealthCode]healthCode{}
	for _, c := range healthCodes {
		g.Expect(tested).NotTo(HaveKey(HealthCode(c.code)), "code %d listed twice", c.code)
		tested[HealthCode(c.code)] = c
	}
	for code, rule := range incidentRules {
		c, ok := tested[code]
		g.Expect(ok).To(BeTrue(), "code %d (%s) is mapped but not tested", code, rule.name)
		g.Expect(rule.name).To(Equal(c.name), "code %d", code)
		g.Expect(string(rule.priority)).To(Equal(c.priority), "DCGM's priority of %s", c.name)
		g.Expect(rule.why).NotTo(BeEmpty(), "code %d has no reason", code)
	}
	for code, c := range tested {
		g.Expect(incidentRules).To(HaveKey(code), "code %d (%s) is tested but not in the table", code, c.name)
	}
}

// TestHealthCodeVariants covers codes whose finding depends on DCGM's grade,
// message or entity.
func TestHealthCodeVariants(t *testing.T) {
	tests := []struct {
		name     string
		incident Incident
		// want is the finding; nil: not reported.
		want *monitors.Finding
	}{
		{
			name:     "NVLINK_ERROR_CRITICAL that DCGM only warns about (successful link recoveries) is Degraded",
			incident: Incident{Code: 71, Message: "Detected 1 link recovery successful events counter NvLink errors on GPU 0's NVLink (should be 0)", Entity: gpu0, Health: HealthWarn},
			want:     &monitors.Finding{Check: gpuhealthv1alpha1.CheckNVLinkErrors, Component: onGPU0, Code: "DCGM_FR_NVLINK_ERROR_CRITICAL", Severity: degraded, Action: recertify},
		},
		{
			name:     "FABRIC_PROBE_STATE while training is in progress (a warning) is Degraded",
			incident: Incident{Code: 123, Message: "GPU 0: Fabric State is In Progress (2). Fabric Manager training in progress.", Entity: gpu0, Health: HealthWarn},
			want:     &monitors.Finding{Check: gpuhealthv1alpha1.CheckFabric, Component: onGPU0, Code: "DCGM_FR_FABRIC_PROBE_STATE", Severity: degraded, Action: recertify},
		},
		{
			name:     "a degraded fabric bandwidth is Degraded",
			incident: Incident{Code: 33, Message: "Detected 4 Fabric Health: Bandwidth Degraded for GPU 0 Bandwidth Degraded", Entity: gpu0, Health: HealthFail},
			want:     &monitors.Finding{Check: gpuhealthv1alpha1.CheckFabric, Component: onGPU0, Code: "DCGM_FR_FIELD_VIOLATION", Severity: degraded, Action: recertify},
		},
		{
			name:     "FIELD_VIOLATION about anything but the fabric health is not reported",
			incident: Incident{Code: 33, Message: "ConnectX entity Id:0 health status: 2", Entity: Entity{Kind: EntityOther, ID: 0}, Health: HealthWarn},
		},
		{
			name:     "an NVSwitch link down (DCGM words it like a GPU's) is on the switch's link",
			incident: Incident{Code: 14, Message: "GPU 2's NvLink link 7 is currently down", Entity: switch2, Health: HealthFail},
			want:     &monitors.Finding{Check: gpuhealthv1alpha1.CheckNVLinkDown, Component: nvlinkComponent("nvswitch-2/link-7"), Code: "DCGM_FR_NVLINK_DOWN", Severity: degraded, Action: recertify},
		},
		{
			name:     "a non-fatal NVSwitch error on a switch link is about the switch",
			incident: Incident{Code: 16, Message: "Detected nonfatal errors on NvSwitch 2 link 0", Entity: Entity{Kind: EntityLink, Parent: EntitySwitch, ID: 2, Link: 9}, Health: HealthWarn},
			want:     &monitors.Finding{Check: gpuhealthv1alpha1.CheckNVSwitch, Component: onSwitch, Code: "DCGM_FR_NVSWITCH_NON_FATAL_ERROR", Severity: degraded, Action: recertify},
		},
		{
			name:     "IMEX_UNHEALTHY about a DOWN domain is a Fatal IMEXDomain finding",
			incident: Incident{Code: 122, Message: "IMEX domain status is DOWN (unhealthy)", Entity: global, Health: HealthFail},
			want:     &monitors.Finding{Check: gpuhealthv1alpha1.CheckIMEXDomain, Component: onDomain, Code: "DCGM_FR_IMEX_UNHEALTHY", Severity: fatal, Action: recertify},
		},
		{
			name:     "IMEX_UNHEALTHY about a DEGRADED domain is a Degraded IMEXDomain finding",
			incident: Incident{Code: 122, Message: "IMEX domain status is DEGRADED (unhealthy)", Entity: global, Health: HealthFail},
			want:     &monitors.Finding{Check: gpuhealthv1alpha1.CheckIMEXDomain, Component: onDomain, Code: "DCGM_FR_IMEX_UNHEALTHY", Severity: degraded, Action: recertify},
		},
		{
			name:     "IMEX_UNHEALTHY about a daemon status of -3 (command error) is not applicable",
			incident: Incident{Code: 122, Message: "IMEX daemon status is -3 (not READY)", Entity: global, Health: HealthFail},
		},
		{
			name:     "IMEX_UNHEALTHY about a daemon status of -1 (not installed) is not applicable",
			incident: Incident{Code: 122, Message: "IMEX daemon status is -1 (not READY)", Entity: global, Health: HealthFail},
		},
		{
			name:     "IMEX_UNHEALTHY about a domain that is NOT_CONFIGURED is not applicable",
			incident: Incident{Code: 122, Message: "IMEX domain status is NOT_CONFIGURED (unhealthy)", Entity: global, Health: HealthFail},
		},
		{
			name:     "a pending page retirement DCGM raises from XID 63 is reported like the field's",
			incident: Incident{Code: 6, Message: "A pending retired page has been detected in GPU 0. (triggered by XID 63: A pending retired page has been detected in GPU 0.)", Entity: gpu0, Health: HealthWarn},
			want:     &monitors.Finding{Check: gpuhealthv1alpha1.CheckECC, Component: onGPU0, Code: "DCGM_FR_PENDING_PAGE_RETIREMENTS", Severity: degraded, Action: reset},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			got, ok := incidentToFinding(tt.incident, testGPUs)
			if tt.want == nil {
				g.Expect(ok).To(BeFalse())
				return
			}
			g.Expect(ok).To(BeTrue())
			g.Expect(got.Message).To(HavePrefix("DCGM health check: " + tt.incident.Message))
			got.Message = ""
			want := *tt.want
			want.Source = gpuhealthv1alpha1.SourceDCGM
			g.Expect(got).To(Equal(want))
		})
	}
}

func TestHealthMessageNamesDCGMsVerdict(t *testing.T) {
	g := NewWithT(t)
	f, ok := incidentToFinding(Incident{Code: 4, Message: "Detected 2 volatile double-bit ECC error(s) in GPU 0.", Entity: gpu0}, testGPUs)
	g.Expect(ok).To(BeTrue())
	g.Expect(f.Message).To(Equal("DCGM health check: Detected 2 volatile double-bit ECC error(s) in GPU 0. [DCGM_FR_VOLATILE_DBE_DETECTED, DCGM priority ISOLATE]"))
}

// TestXIDHistoryIncidents: DCGM keeps an incident it derived from an XID in
// every check until the host engine restarts; a repeat would read as a new
// fault (and fail a recertification), so it is reported once. The same code
// from DCGM's own field check repeats as usual.
func TestXIDHistoryIncidents(t *testing.T) {
	g := NewWithT(t)
	client := newFakeClient()
	p := newPoller(t, Source{}, client)
	fromXID := Incident{Code: 80, Message: "GPU 0 had uncorrectable memory errors and row remapping failed. (triggered by XID 64: GPU %u had uncorrectable memory errors and row remapping failed.)", Entity: gpu0, Health: HealthFail}
	fromField := Incident{Code: 80, Message: "GPU 1 had uncorrectable memory errors and row remapping failed.", Entity: Entity{Kind: EntityGPU, ID: 1}, Health: HealthFail}
	client.setIncidents(fromXID, fromField)
	p.poll(0)
	g.Expect(p.rec.take()).To(HaveLen(2))
	p.poll(DefaultRepeatInterval)
	got := p.rec.take()
	g.Expect(got).To(HaveLen(1), "only the field's incident repeats")
	g.Expect(got[0].Component).To(Equal(gpuComponent("GPU-bbbb")))

	// Both on one key: the one that repeats decides.
	client.setIncidents(fromXID, Incident{Code: 80, Message: "GPU 0 had uncorrectable memory errors and row remapping failed.", Entity: gpu0, Health: HealthFail})
	p.poll(DefaultRepeatInterval)
	got = p.rec.take()
	g.Expect(got).To(HaveLen(2))
	g.Expect(got).To(ContainElement(And(HaveField("Component", gpuComponent("GPU-aaaa")), HaveField("Resolved", false))), "GPU 0's condition repeats")
	g.Expect(got).To(ContainElement(And(HaveField("Component", gpuComponent("GPU-bbbb")), HaveField("Resolved", true))), "GPU 1's resolved")
}

func TestCoalescedIncidentsKeepTheWorst(t *testing.T) {
	g := NewWithT(t)
	client := newFakeClient()
	p := newPoller(t, Source{}, client)
	client.setIncidents(
		Incident{Code: 33, Message: "Detected 4 Fabric Health: Bandwidth Degraded for GPU 0 Bandwidth Degraded", Entity: gpu0, Health: HealthFail},
		Incident{Code: 33, Message: "Detected 1 Fabric Health: Route Unhealthy for GPU 0 Route Unhealthy", Entity: gpu0, Health: HealthFail},
	)
	p.poll(0)
	got := p.rec.take()
	g.Expect(got).To(HaveLen(1))
	g.Expect(got[0].Severity).To(Equal(fatal))
}

// TestRecoveryAction: DCGM_FI_DEV_GPU_RECOVERY_ACTION (1523), with NVML's
// values 0 NONE, 1 GPU_RESET, 2 NODE_REBOOT, 3 DRAIN_P2P, 4 DRAIN_AND_RESET,
// sets the action of the GPU's health findings.
func TestRecoveryAction(t *testing.T) {
	linkDown := Incident{Code: 14, Message: "GPU 0's NvLink link 3 is currently down", Entity: gpu0, Health: HealthFail}
	tests := []struct {
		name     string
		incident Incident
		// action is field 1523 on GPU 0; nil: no value.
		action       any
		wantSeverity gpuhealthv1alpha1.Severity
		wantAction   gpuhealthv1alpha1.Action
	}{
		{name: "NONE changes nothing", incident: linkDown, action: 0, wantSeverity: degraded, wantAction: recertify},
		{name: "GPU_RESET asks for a GPU reset", incident: linkDown, action: 1, wantSeverity: fatal, wantAction: reset},
		{name: "NODE_REBOOT asks for a reboot", incident: linkDown, action: 2, wantSeverity: fatal, wantAction: reboot},
		{name: "DRAIN_P2P changes nothing", incident: linkDown, action: 3, wantSeverity: degraded, wantAction: recertify},
		{name: "DRAIN_AND_RESET asks for a GPU reset (gpuhealth drains first)", incident: linkDown, action: 4, wantSeverity: fatal, wantAction: reset},
		{name: "an unknown value changes nothing", incident: linkDown, action: 9, wantSeverity: degraded, wantAction: recertify},
		{name: "no value changes nothing", incident: linkDown, action: nil, wantSeverity: degraded, wantAction: recertify},
		{name: "a reset may replace a reboot", incident: Incident{Code: 120, Message: "GPU 0 has fallen off the bus", Entity: gpu0}, action: 1, wantSeverity: fatal, wantAction: reset},
		{
			name:     "it applies to a GPU's link entity",
			incident: Incident{Code: 70, Message: "150.0 CRC NvLink errors", Entity: Entity{Kind: EntityLink, Parent: EntityGPU, ID: 0, Link: 2}},
			action:   2, wantSeverity: fatal, wantAction: reboot,
		},
		{
			name:     "it does not replace a person",
			incident: Incident{Code: 7, Message: "60 or more retired pages have been detected in GPU 0. ", Entity: gpu0},
			action:   1, wantSeverity: fatal, wantAction: support,
		},
		{
			name:     "it is about the GPU, not an NVSwitch",
			incident: Incident{Code: 16, Message: "Detected nonfatal errors on NvSwitch 0 link 0", Entity: Entity{Kind: EntitySwitch, ID: 0}},
			action:   2, wantSeverity: degraded, wantAction: recertify,
		},
		{
			name:     "it is about its own GPU only",
			incident: Incident{Code: 14, Message: "GPU 1's NvLink link 3 is currently down", Entity: Entity{Kind: EntityGPU, ID: 1}},
			action:   1, wantSeverity: degraded, wantAction: recertify,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			client := newFakeClient()
			if tt.action != nil {
				client.setCounter(0, FieldGPURecoveryAction, int64(tt.action.(int)))
			}
			p := newPoller(t, Source{}, client)
			client.setIncidents(tt.incident)
			p.poll(0)
			got := p.rec.take()
			g.Expect(got).To(HaveLen(1))
			g.Expect(got[0].Severity).To(Equal(tt.wantSeverity))
			g.Expect(got[0].Action).To(Equal(tt.wantAction))
		})
	}

	t.Run("the message says which recovery action DCGM reported", func(t *testing.T) {
		g := NewWithT(t)
		client := newFakeClient()
		client.setCounter(0, FieldGPURecoveryAction, 4)
		p := newPoller(t, Source{}, client)
		client.setIncidents(linkDown)
		p.poll(0)
		got := p.rec.all()
		g.Expect(got).To(HaveLen(1))
		g.Expect(got[0].Message).To(HaveSuffix("; DCGM_FI_DEV_GPU_RECOVERY_ACTION is 4 (DRAIN_AND_RESET)"))
	})

	t.Run("the action follows the field from one poll to the next", func(t *testing.T) {
		g := NewWithT(t)
		client := newFakeClient()
		p := newPoller(t, Source{}, client)
		client.setIncidents(linkDown)
		p.poll(0)
		g.Expect(p.rec.take()).To(ConsistOf(HaveField("Action", recertify)))
		client.setCounter(0, FieldGPURecoveryAction, 2)
		p.poll(DefaultRepeatInterval)
		g.Expect(p.rec.take()).To(ConsistOf(HaveField("Action", reboot)))
	})
}

// TestXID154 judges DCGM's XID 154 policy violation (the driver's "GPU
// recovery action changed") by field 1523, read when it arrives.
func TestXID154(t *testing.T) {
	tests := []struct {
		name         string
		action       any
		wantSeverity gpuhealthv1alpha1.Severity
		wantAction   gpuhealthv1alpha1.Action
	}{
		{name: "GPU_RESET", action: 1, wantSeverity: fatal, wantAction: reset},
		{name: "NODE_REBOOT", action: 2, wantSeverity: fatal, wantAction: reboot},
		{name: "DRAIN_AND_RESET", action: 4, wantSeverity: fatal, wantAction: reset},
		{name: "NONE leaves it to the XID catalog", action: 0},
		{name: "no value leaves it to the XID catalog", action: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			client := newFakeClient()
			if tt.action != nil {
				client.setCounter(0, FieldGPURecoveryAction, int64(tt.action.(int)))
			}
			p := newPoller(t, Source{}, client)
			p.run.violation(Violation{Kind: ViolationXID, GPU: 0, XID: 154, Time: testStart})
			got := p.rec.take()
			g.Expect(got).To(HaveLen(1))
			g.Expect(got[0].Check).To(Equal(gpuhealthv1alpha1.CheckXID))
			g.Expect(got[0].Code).To(Equal("154"))
			g.Expect(got[0].Severity).To(Equal(tt.wantSeverity))
			g.Expect(got[0].Action).To(Equal(tt.wantAction))
		})
	}

	t.Run("other XIDs are left to the XID catalog", func(t *testing.T) {
		g := NewWithT(t)
		client := newFakeClient()
		client.setCounter(0, FieldGPURecoveryAction, 1)
		p := newPoller(t, Source{}, client)
		p.run.violation(Violation{Kind: ViolationXID, GPU: 0, XID: 74})
		got := p.rec.take()
		g.Expect(got).To(HaveLen(1))
		g.Expect(got[0].Action).To(BeEmpty())
	})
}

// TestHealthSystemsAreDrivable: every enabled watch's incidents reach the
// source through the fake client, whatever system DCGM files them under.
func TestHealthSystemsAreDrivable(t *testing.T) {
	g := NewWithT(t)
	systems := map[HealthSystem]Incident{
		HealthPCIe:             {Code: 3, Message: "Detected more than 8 PCIe replays per minute for GPU 0 : 9", Entity: gpu0},
		HealthNVLink:           {Code: 70, Message: "150.0 CRC NvLink errors", Entity: gpu0},
		HealthMem:              {Code: 4, Message: "Detected 1 volatile double-bit ECC error(s) in GPU 0.", Entity: gpu0},
		HealthInforom:          {Code: 9, Message: "A corrupt InfoROM has been detected in GPU 0.", Entity: gpu0},
		HealthNVSwitchNonFatal: {Code: 16, Message: "Detected nonfatal errors on NvSwitch 2 link 0", Entity: switch2},
		HealthNVSwitchFatal:    {Code: 15, Message: "Detected fatal errors on NvSwitch 2 link 0", Entity: switch2},
		HealthIMEX:             {Code: 122, Message: "IMEX daemon status is 0 (not READY)", Entity: global},
		HealthThermal:          {Code: 10, Message: "Detected clocks event due to thermal violation in GPU 0.", Entity: gpu0},
		HealthPower:            {Code: 11, Message: "Cannot reliably read the power usage for GPU 0.", Entity: gpu0},
	}
	var all HealthSystem
	for s := range systems {
		all |= s
	}
	g.Expect(all).To(Equal(DefaultHealthSystems), "one incident per enabled watch")
	for s, in := range systems {
		client := newFakeClient()
		p := newPoller(t, Source{}, client)
		in.System = s
		client.setIncidents(in)
		p.poll(0)
		got := p.rec.take()
		g.Expect(got).To(HaveLen(1), "system %#x", s)
	}
}
