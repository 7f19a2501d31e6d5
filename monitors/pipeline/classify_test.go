package pipeline

import (
	"strconv"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/api/xid"
	"github.com/gpuhealth/gpuhealth/monitors"
)

func TestClassify(t *testing.T) {
	gpu := gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "GPU-1"}
	tests := []struct {
		name         string
		in           monitors.Finding
		wantSeverity gpuhealthv1alpha1.Severity
		wantAction   gpuhealthv1alpha1.Action
		wantMessage  string
	}{
		{name: "XID 79 is Fatal and asks for a reboot (catalog RESTART_BM)",
			in: monitors.Finding{Check: gpuhealthv1alpha1.CheckXID, Code: "79", Component: gpu}, wantSeverity: gpuhealthv1alpha1.SeverityFatal, wantAction: gpuhealthv1alpha1.ActionRebootNode, wantMessage: "XID 79: "},
		{name: "XID 48 asks for a GPU reset",
			in: monitors.Finding{Check: gpuhealthv1alpha1.CheckXID, Code: "48", Component: gpu}, wantSeverity: gpuhealthv1alpha1.SeverityFatal, wantAction: gpuhealthv1alpha1.ActionResetGPU},
		{name: "a GPU reset without the GPU's identity becomes a reboot",
			in: monitors.Finding{Check: gpuhealthv1alpha1.CheckXID, Code: "48", Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNode}}, wantSeverity: gpuhealthv1alpha1.SeverityFatal, wantAction: gpuhealthv1alpha1.ActionRebootNode},
		{name: "XID 13 is an application fault: Info, no action",
			in: monitors.Finding{Check: gpuhealthv1alpha1.CheckXID, Code: "13", Component: gpu, Message: "Graphics SM Warp Exception"}, wantSeverity: gpuhealthv1alpha1.SeverityInfo, wantAction: gpuhealthv1alpha1.ActionNone, wantMessage: "Graphics SM Warp Exception"},
		{name: "an unknown XID is Fatal, contact support, and says so",
			in: monitors.Finding{Check: gpuhealthv1alpha1.CheckXID, Code: "999", Component: gpu, Message: "something new"}, wantSeverity: gpuhealthv1alpha1.SeverityFatal, wantAction: gpuhealthv1alpha1.ActionContactSupport, wantMessage: "unknown XID 999"},
		{name: "XID 154 reads the recovery action from the message",
			in: monitors.Finding{Check: gpuhealthv1alpha1.CheckXID, Code: "154", Component: gpu, Message: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"}, wantSeverity: gpuhealthv1alpha1.SeverityFatal, wantAction: gpuhealthv1alpha1.ActionRebootNode},
		{name: "a source's own severity and action are kept",
			in: monitors.Finding{Check: gpuhealthv1alpha1.CheckXID, Code: "79", Component: gpu, Severity: gpuhealthv1alpha1.SeverityDegraded, Action: gpuhealthv1alpha1.ActionRecertify}, wantSeverity: gpuhealthv1alpha1.SeverityDegraded, wantAction: gpuhealthv1alpha1.ActionRecertify},
		{name: "a lost GPU is Fatal and asks for a reboot",
			in: monitors.Finding{Check: gpuhealthv1alpha1.CheckGPULost, Code: "GPU_IS_LOST", Component: gpu}, wantSeverity: gpuhealthv1alpha1.SeverityFatal, wantAction: gpuhealthv1alpha1.ActionRebootNode},
		{name: "NVLink errors are Degraded and ask for recertification",
			in: monitors.Finding{Check: gpuhealthv1alpha1.CheckNVLinkErrors, Code: "CRC_FLIT"}, wantSeverity: gpuhealthv1alpha1.SeverityDegraded, wantAction: gpuhealthv1alpha1.ActionRecertify},
		{name: "a fabric fault is Fatal",
			in: monitors.Finding{Check: gpuhealthv1alpha1.CheckFabric, Code: "UNHEALTHY"}, wantSeverity: gpuhealthv1alpha1.SeverityFatal, wantAction: gpuhealthv1alpha1.ActionRecertify},
		{name: "an IMEX domain fault is Fatal, a daemon fault Degraded",
			in: monitors.Finding{Check: gpuhealthv1alpha1.CheckIMEXDomain, Code: "DOWN"}, wantSeverity: gpuhealthv1alpha1.SeverityFatal, wantAction: gpuhealthv1alpha1.ActionRecertify},
		{name: "an IMEX daemon fault is Degraded",
			in: monitors.Finding{Check: gpuhealthv1alpha1.CheckIMEXDaemon, Code: "UNAVAILABLE"}, wantSeverity: gpuhealthv1alpha1.SeverityDegraded, wantAction: gpuhealthv1alpha1.ActionRecertify},
		{name: "a check with no default is Degraded and asks for recertification",
			in: monitors.Finding{Check: "Acoustic", Code: "LOUD"}, wantSeverity: gpuhealthv1alpha1.SeverityDegraded, wantAction: gpuhealthv1alpha1.ActionRecertify},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			f := tt.in
			classify(&f, nil)
			g.Expect(f.Severity).To(Equal(tt.wantSeverity))
			g.Expect(f.Action).To(Equal(tt.wantAction))
			g.Expect(f.Message).To(ContainSubstring(tt.wantMessage))
		})
	}
}

func TestClassifyAgreesWithTheCatalog(t *testing.T) {
	g := NewWithT(t)
	gpu := gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "GPU-1"}
	for _, e := range xid.Entries() {
		f := monitors.Finding{Check: gpuhealthv1alpha1.CheckXID, Code: strconv.Itoa(e.XID), Component: gpu}
		classify(&f, nil)
		g.Expect(f.Severity).To(Equal(e.Severity), "XID %d", e.XID)
		g.Expect(f.Action).To(Equal(e.Action), "XID %d", e.XID)
	}
}

func TestNormalize(t *testing.T) {
	tests := []struct {
		name    string
		in      monitors.Finding
		wantErr string
		check   func(g Gomega, f monitors.Finding)
	}{
		{name: "a finding without a code is refused", in: monitors.Finding{Source: "nvml", Check: "XID"}, wantErr: "no code"},
		{name: "a finding without a source is refused", in: monitors.Finding{Check: "XID", Code: "79"}, wantErr: "no source"},
		{name: "an XID code must be a number", in: monitors.Finding{Source: "kmsg", Check: "XID", Code: "7x9", Component: gpuhealthv1alpha1.Component{Kind: "GPU", ID: "GPU-1"}}, wantErr: "number from 0 to 99999"},
		{name: "an XID code above 99999 is refused", in: monitors.Finding{Source: "kmsg", Check: "XID", Code: "100000", Component: gpuhealthv1alpha1.Component{Kind: "GPU", ID: "GPU-1"}}, wantErr: "number from 0 to 99999"},
		{name: "a GPU component needs an id", in: monitors.Finding{Source: "nvml", Check: "GPULost", Code: "GPU_IS_LOST", Component: gpuhealthv1alpha1.Component{Kind: "GPU"}}, wantErr: "UUID or PCI bus id"},
		{name: "a missing component kind means the node", in: monitors.Finding{Source: "imex", Check: "IMEXDomain", Code: "DOWN"}, check: func(g Gomega, f monitors.Finding) {
			g.Expect(f.Component.Kind).To(Equal(gpuhealthv1alpha1.ComponentNode))
		}},
		{name: "the message becomes one bounded line of valid UTF-8", in: monitors.Finding{Source: "kmsg", Check: "SXID", Code: "1",
			Message: "a\nb\t\xff" + strings.Repeat("é", 2000)}, check: func(g Gomega, f monitors.Finding) {
			g.Expect(len(f.Message)).To(BeNumerically("<=", maxMessage))
			g.Expect(f.Message).To(HavePrefix("a b ?"))
			g.Expect(f.Message).To(HaveSuffix("é..."))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			f := tt.in
			err := normalize(&f)
			if tt.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tt.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			tt.check(g, f)
		})
	}
}
