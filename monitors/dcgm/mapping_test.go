package dcgm

import (
	"testing"

	. "github.com/onsi/gomega"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// testGPUs are the GPUs the mapping tests know.
var testGPUs = newGPUIDs([]GPU{
	{ID: 0, UUID: "GPU-aaaa", PCIBusID: "00000000:3B:00.0"},
	{ID: 1, PCIBusID: "00000000:86:00.0"},
})

func gpuComponent(id string) gpuhealthv1alpha1.Component {
	return gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: id}
}

func nvlinkComponent(id string) gpuhealthv1alpha1.Component {
	return gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVLink, ID: id}
}

func TestViolationToFinding(t *testing.T) {
	tests := []struct {
		name      string
		violation Violation
		want      monitors.Finding
		wantOK    bool
	}{
		{
			name:      "an XID violation is an XID finding on the GPU, coded by number, left for the pipeline to classify",
			violation: Violation{Kind: ViolationXID, GPU: 0, XID: 79, Time: testStart},
			want: monitors.Finding{
				Source: gpuhealthv1alpha1.SourceDCGM, Check: gpuhealthv1alpha1.CheckXID,
				Component: gpuComponent("GPU-aaaa"), Code: "79", Time: testStart,
			},
			wantOK: true,
		},
		{
			name:      "a GPU DCGM listed without a UUID is named by its PCI bus id",
			violation: Violation{Kind: ViolationXID, GPU: 1, XID: 48},
			want: monitors.Finding{
				Source: gpuhealthv1alpha1.SourceDCGM, Check: gpuhealthv1alpha1.CheckXID,
				Component: gpuComponent("00000000:86:00.0"), Code: "48",
			},
			wantOK: true,
		},
		{
			name:      "a GPU DCGM did not list is named by its DCGM id",
			violation: Violation{Kind: ViolationXID, GPU: 7, XID: 13},
			want: monitors.Finding{
				Source: gpuhealthv1alpha1.SourceDCGM, Check: gpuhealthv1alpha1.CheckXID,
				Component: gpuComponent("dcgm-gpu-7"), Code: "13",
			},
			wantOK: true,
		},
		{
			name:      "an NVLink violation on a total counter is a Degraded NVLinkErrors finding on the GPU named by the counter",
			violation: Violation{Kind: ViolationNVLink, GPU: 0, Field: FieldNVLinkCRCFlitErrorTotal, Counter: 12},
			want: monitors.Finding{
				Source: gpuhealthv1alpha1.SourceDCGM, Check: gpuhealthv1alpha1.CheckNVLinkErrors,
				Component: gpuComponent("GPU-aaaa"), Code: "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL",
				Severity: gpuhealthv1alpha1.SeverityDegraded, Action: gpuhealthv1alpha1.ActionRecertify,
			},
			wantOK: true,
		},
		{
			name:      "an NVLink violation on a per-link counter is pinned to the link and coded by the counter's total",
			violation: Violation{Kind: ViolationNVLink, GPU: 0, Field: 453, Counter: 3}, // CRC flit, link 8
			want: monitors.Finding{
				Source: gpuhealthv1alpha1.SourceDCGM, Check: gpuhealthv1alpha1.CheckNVLinkErrors,
				Component: nvlinkComponent("GPU-aaaa/link-8"), Code: "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL",
				Severity: gpuhealthv1alpha1.SeverityDegraded, Action: gpuhealthv1alpha1.ActionRecertify,
			},
			wantOK: true,
		},
		{
			name:      "an NVLink violation on a link of the last range maps past the gap at field 490",
			violation: Violation{Kind: ViolationNVLink, GPU: 0, Field: 493, Counter: 1}, // recovery, link 17
			want: monitors.Finding{
				Source: gpuhealthv1alpha1.SourceDCGM, Check: gpuhealthv1alpha1.CheckNVLinkErrors,
				Component: nvlinkComponent("GPU-aaaa/link-17"), Code: "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL",
				Severity: gpuhealthv1alpha1.SeverityDegraded, Action: gpuhealthv1alpha1.ActionRecertify,
			},
			wantOK: true,
		},
		{
			name:      "an NVLink violation on a field this package does not know is coded by its number",
			violation: Violation{Kind: ViolationNVLink, GPU: 0, Field: 1220, Counter: 1},
			want: monitors.Finding{
				Source: gpuhealthv1alpha1.SourceDCGM, Check: gpuhealthv1alpha1.CheckNVLinkErrors,
				Component: gpuComponent("GPU-aaaa"), Code: "DCGM_FI_1220",
				Severity: gpuhealthv1alpha1.SeverityDegraded, Action: gpuhealthv1alpha1.ActionRecertify,
			},
			wantOK: true,
		},
		{
			name:      "a violation of another kind is not reported",
			violation: Violation{Kind: ViolationOther, GPU: 0},
			wantOK:    false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			got, ok := violationToFinding(tt.violation, testGPUs)
			g.Expect(ok).To(Equal(tt.wantOK))
			got.Message = ""
			g.Expect(got).To(Equal(tt.want))
		})
	}
}

func TestIncidentToFinding(t *testing.T) {
	tests := []struct {
		name          string
		incident      Incident
		wantComponent gpuhealthv1alpha1.Component
		wantCode      string
		wantOK        bool
	}{
		{
			name:          "an NVLink down on a GPU names the link from DCGM's message",
			incident:      Incident{Code: HealthNVLinkDown, Message: "GPU 0's NvLink link 3 is currently down", Entity: Entity{Kind: EntityGPU, ID: 0}},
			wantComponent: nvlinkComponent("GPU-aaaa/link-3"),
			wantCode:      "DCGM_FR_NVLINK_DOWN",
			wantOK:        true,
		},
		{
			name:          "an NVLink down on a link entity names the link",
			incident:      Incident{Code: HealthNVLinkDown, Message: "down", Entity: Entity{Kind: EntityLink, Parent: EntityGPU, ID: 0, Link: 11}},
			wantComponent: nvlinkComponent("GPU-aaaa/link-11"),
			wantCode:      "DCGM_FR_NVLINK_DOWN",
			wantOK:        true,
		},
		{
			name:          "an NVLink down without a link in the message is about the GPU",
			incident:      Incident{Code: HealthNVLinkDown, Message: "NvLink is down", Entity: Entity{Kind: EntityGPU, ID: 0}},
			wantComponent: gpuComponent("GPU-aaaa"),
			wantCode:      "DCGM_FR_NVLINK_DOWN",
			wantOK:        true,
		},
		{
			name:          "a link of an NVSwitch is named after the switch",
			incident:      Incident{Code: HealthNVLinkCRCErrorThreshold, Entity: Entity{Kind: EntityLink, Parent: EntitySwitch, ID: 2, Link: 40}},
			wantComponent: nvlinkComponent("nvswitch-2/link-40"),
			wantCode:      "DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD",
			wantOK:        true,
		},
		{
			name:          "a fatal SXID on a switch is coded by the SXid number from DCGM's message",
			incident:      Incident{Code: HealthSXIDError, Message: "Detected fatal NvSwitch SXID 12028", Entity: Entity{Kind: EntitySwitch, ID: 1}},
			wantComponent: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVSwitch, ID: "nvswitch-1"},
			wantCode:      "12028",
			wantOK:        true,
		},
		{
			name:          "a fatal SXID on a switch link is about the switch",
			incident:      Incident{Code: HealthSXIDError, Message: "Detected fatal NvSwitch SXID 20034", Entity: Entity{Kind: EntityLink, Parent: EntitySwitch, ID: 3, Link: 7}},
			wantComponent: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVSwitch, ID: "nvswitch-3"},
			wantCode:      "20034",
			wantOK:        true,
		},
		{
			name:          "a fatal SXID without a number in the message keeps DCGM's code",
			incident:      Incident{Code: HealthSXIDError, Message: "NvSwitch fatal error", Entity: Entity{Kind: EntitySwitch, ID: 1}},
			wantComponent: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVSwitch, ID: "nvswitch-1"},
			wantCode:      "DCGM_FR_SXID_ERROR",
			wantOK:        true,
		},
		{
			name:          "a fabric training error without an entity is about the node",
			incident:      Incident{Code: HealthFabricManagerTrainingError, Entity: Entity{Kind: EntityNone}},
			wantComponent: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNode},
			wantCode:      "DCGM_FR_FABRIC_MANAGER_TRAINING_ERROR",
			wantOK:        true,
		},
		{
			name:          "an IMEX incident is about the IMEX daemon whatever its entity",
			incident:      Incident{Code: HealthIMEXUnhealthy, Entity: Entity{Kind: EntityNone}},
			wantComponent: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentIMEX, ID: "daemon"},
			wantCode:      "DCGM_FR_IMEX_UNHEALTHY",
			wantOK:        true,
		},
		{
			name:     "an XID incident is left to the XID policy violation",
			incident: Incident{Code: HealthXIDError, Entity: Entity{Kind: EntityGPU, ID: 0}},
			wantOK:   false,
		},
		{
			name:     "an incident code the source does not map is not reported",
			incident: Incident{Code: 12, Entity: Entity{Kind: EntityGPU, ID: 0}},
			wantOK:   false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			got, ok := incidentToFinding(tt.incident, testGPUs)
			g.Expect(ok).To(Equal(tt.wantOK))
			if !ok {
				return
			}
			g.Expect(got.Source).To(Equal(gpuhealthv1alpha1.SourceDCGM))
			g.Expect(got.Component).To(Equal(tt.wantComponent))
			g.Expect(got.Code).To(Equal(tt.wantCode))
			g.Expect(got.Message).To(HavePrefix("DCGM health check: "))
		})
	}
}

func TestFieldString(t *testing.T) {
	g := NewWithT(t)
	g.Expect(FieldNVLinkReplayErrorTotal.String()).To(Equal("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL"))
	g.Expect(FieldIMEXDaemonStatus.String()).To(Equal("DCGM_FI_IMEX_DAEMON_STATUS"))
	g.Expect(Field(230).String()).To(Equal("DCGM_FI_230"))
	g.Expect(perLinkFields).To(HaveLen(4*18), "four counters on 18 links")
}
