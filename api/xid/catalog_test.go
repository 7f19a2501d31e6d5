package xid

import (
	"fmt"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// bucketActions is what NVIDIA's "Resolution Buckets" sheet asks for, read
// into gpuhealth's actions: the test's own reading of the sheet, kept apart
// from the mapping in catalog.go.
var bucketActions = map[string]struct {
	severity gpuhealthv1alpha1.Severity
	action   gpuhealthv1alpha1.Action
}{
	"RESET_GPU":           {gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionResetGPU},       // "Refer to … GPU Reset"
	"WORKFLOW_XID_48":     {gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionResetGPU},       // "Solo: RESET_GPU; w/ 63 or 64: DRAIN_AND_RESET"
	"RESTART_BM":          {gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode},     // "Restart bare metal"
	"RESTART_VM":          {gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode},     // "VM … must be restarted"
	"CONTACT_SUPPORT":     {gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport}, // "contact your support organization"
	"CHECK_MECHANICALS":   {gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport}, // "check … seating"
	"UPDATE_SWFW":         {gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport}, // "Update Firmware and Software"
	"WORKFLOW_NVLINK_ERR": {gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionResetGPU},       // XID 74: "A GPU reset or node reboot is needed"
	"RESTART_APP":         {gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone},            // "RESET_GPU or RESTART_BM is not deemed necessary"
	"IGNORE":              {gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone},            // "No Action required"
	"XID_154_EVAL":        {gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone},            // "If no XID 154 present, RESTART_APP"
	"DECODE_RESET_GPU":    {gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionResetGPU},       // a decode row's RESET_GPU
	"DECODE_IGNORE":       {gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone},            // a decode row's IGNORE
	"DECODE_XID_154_EVAL": {gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone},            // a decode row's XID_154_EVAL
}

func TestEveryCatalogRowHasAVerdict(t *testing.T) {
	g := NewWithT(t)
	g.Expect(Rows()).To(HaveLen(172), "NVIDIA's catalog lists XIDs 1 to 172")
	for _, r := range Rows() {
		e := Lookup(r.Code, "")
		g.Expect(e.Known).To(BeTrue(), "XID %d", r.Code)
		g.Expect(e.Mnemonic).To(Equal(r.Mnemonic), "XID %d", r.Code)
		g.Expect(e.Reason).NotTo(BeEmpty(), "XID %d", r.Code)
		g.Expect(validSeverity(e.Severity) && validAction(e.Action)).To(BeTrue(), "XID %d: %+v", r.Code, e)
		if want, ok := bucketActions[e.Bucket]; ok {
			g.Expect([]any{e.Severity, e.Action}).To(Equal([]any{want.severity, want.action}), "XID %d in %s", r.Code, e.Bucket)
		}
		if r.Immediate == "" {
			g.Expect(e.Bucket).To(Equal("NO_BUCKET"), "XID %d", r.Code)
		} else if !strings.HasPrefix(e.Bucket, "DECODE_") {
			g.Expect(e.Bucket).To(Equal(r.Immediate), "XID %d", r.Code)
		}
	}
}

// TestEveryDecodeRowDecides builds, for every row of NVIDIA's decode sheet
// and both IntrInfo layouts, the registers the row describes ('1' bits set,
// '-' bits clear) and the line the driver prints for them, and checks that
// the row's recovery action decides.
func TestEveryDecodeRowDecides(t *testing.T) {
	resets := 0
	for i, r := range DecodeRows() {
		for l, patterns := range [][2]string{{r.V1IntrInfo, r.V1Action2IntrInfo}, {r.V2IntrInfo, r.V2Action2IntrInfo}} {
			names := strings.Split(r.Subcode, "/")
			name := names[min(l, len(names)-1)]
			status := uint32(0)
			if s := strings.Split(r.ErrorStatus, "/")[0]; s != "" {
				_, err := fmt.Sscanf(s, "0x%x", &status)
				if err != nil {
					t.Fatalf("row %d: error status %q: %v", i+2, r.ErrorStatus, err)
				}
			}
			for alt, pattern := range patterns {
				if pattern == "" {
					continue
				}
				want := r.Immediate
				if alt == 1 {
					want = r.Action2
				}
				msg := fmt.Sprintf("%s Nonfatal XC0 i0 Link 03 (0x%08x 0x%08x 0x00000000 0x00000000 0x00000000 0x00000000)",
					strings.ReplaceAll(name, " ", "_"), ones(pattern), status)
				e := Lookup(r.XID, msg)
				wantV := bucketActions["DECODE_"+want]
				if e.Bucket != "DECODE_"+want || e.Severity != wantV.severity || e.Action != wantV.action {
					t.Errorf("decode row %d (XID %d %s, layout %d, status %s): Lookup(%q) = %s %s/%s; want DECODE_%s",
						i+2, r.XID, r.Subcode, l+1, r.ErrorStatus, msg, e.Bucket, e.Severity, e.Action, want)
				}
			}
		}
		if r.Immediate == "RESET_GPU" {
			resets++
		}
	}
	// The sheet has 95 rows, 42 of them with RESET_GPU.
	if n := len(DecodeRows()); n != 95 || resets != 42 {
		t.Errorf("decode sheet has %d rows, %d of them RESET_GPU; NVIDIA's has 95 and 42", n, resets)
	}
}

// ones returns the pattern's '1' bits as a number.
func ones(pattern string) uint32 {
	var v uint32
	for _, c := range pattern {
		v <<= 1
		if c == '1' {
			v |= 1
		}
	}
	return v
}

// TestDriverLines checks verdicts on lines in the driver's own formats:
// NVLink5 (…"%s %s XC%d i%d Link %d (0x%08x 0x%08x …)"), XID 45 with and
// without the "caused by previous Xid" suffix, XID 154's recovery actions.
func TestDriverLines(t *testing.T) {
	F, D, I := gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.SeverityInfo
	reset, reboot, recert, none, support := gpuhealthv1alpha1.ActionResetGPU, gpuhealthv1alpha1.ActionRebootNode,
		gpuhealthv1alpha1.ActionRecertify, gpuhealthv1alpha1.ActionNone, gpuhealthv1alpha1.ActionContactSupport
	cases := []struct {
		name     string
		xid      int
		msg      string
		recent   []int
		severity gpuhealthv1alpha1.Severity
		action   gpuhealthv1alpha1.Action
	}{
		{"RLW_REMAP status 0x40 resets although the line says Nonfatal (R575 layout)", 145, "RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000004 0x00000040 0x00000000 0x00000000 0x00000000 0x00000000)", nil, F, reset},
		{"RLW_REMAP status 0x80 resets (pre-R575 layout)", 145, "RLW_REMAP Fatal XC1 i0 Link 10 (0x00000082 0x00000080 0x00000000 0x00000000 0x00000000 0x00000000)", nil, F, reset},
		{"RLW_REMAP status 0x100 is ignored", 145, "RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000100 0x00000000 0x00000000)", nil, I, none},
		{"RLW_SRC_TRACK status 8 waits for XID 154", 145, "pid=11436, name=cache_mgr_main, RLW_SRC_TRACK Nonfatal XC1 i0 Link 03 (0x040868e2 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)", nil, I, none},
		{"RLW_RXPIPE with IntrInfo bit 10 set takes Action 2 (reset)", 145, "RLW_RXPIPE Nonfatal XC0 i0 Link 00 (0x000004c2 0x00000001 0x00000000 0x00000000)", nil, F, reset},
		{"RLW_RXPIPE with IntrInfo bit 10 clear is ignored", 145, "RLW_RXPIPE Nonfatal XC0 i0 Link 00 (0x000000c2 0x00000001 0x00000000 0x00000000)", nil, I, none},
		{"a NETIR_LINK_EVT link down resets", 149, "NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)", nil, F, reset},
		{"a NETIR_LINK_EVT link down with reason 100101 (peer device) resets", 149, "NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)", nil, F, reset},
		{"a NETIR_LINK_EVT link down with reason 100110 is ignored", 149, "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)", nil, I, none},
		{"an R575 NETIR_LINK_DOWN resets", 149, "NETIR_LINK_EVT/NETIR_LINK_DOWN Fatal XC0 i0 Link 00 (0x01000011 0x00000000 0x00000000 0x00000000)", nil, F, reset},
		{"a NETIR interrupt on link -1 resets", 149, "NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)", nil, F, reset},
		{"a BER event is ignored", 149, "NETIR_BER_EVENT Nonfatal XC0 i0 Link 01 (0x00082226 0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)", nil, I, none},
		{"an MFDE event status 1 resets", 149, "NETIR_MFDE_EVENT Fatal XC0 i0 Link 00 (0x00000014 0x00000001 0x00000000 0x00000000)", nil, F, reset},
		{"SAW_MVB status 8 is ignored", 144, "SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)", nil, I, none},
		{"an MSE watchdog resets", 150, "MSE_WATCHDOG Fatal XC0 i0 Link 00 (0x00000000 0x00000000 0x00000000 0x00000000)", nil, F, reset},
		{"a Fatal line no row matches falls back to its flag", 146, "TLW_FOO Fatal XC0 i0 Link 02 (0x7fffffff 0x7fffffff 0x00000000 0x00000000)", nil, F, reset},
		{"a Nonfatal line without registers is recorded", 145, "RLW_REMAP Nonfatal XC1 i0 Link 10", nil, D, none},
		{"an NVLink5 XID without text (NVML) is recertified", 147, "", nil, D, recert},
		{"XID 45 caused by a previous XID follows it", 45, "pid=9, name=a, Ch 00000010 caused by previous Xid 48", nil, I, none},
		{"XID 45 after another XID on the GPU follows it", 45, "pid=9, name=a, Ch 00000010", []int{45, 79}, I, none},
		{"a solo XID 45 resets the GPU (RESTART_FM)", 45, "pid=9, name=a, Ch 00000010", []int{45}, F, reset},
		{"XID 48 alone resets", 48, "pid=1, name=a, Ch 00000076", nil, F, reset},
		{"XID 48 with 63 drains and resets", 48, "", []int{63}, F, reset},
		{"XID 154 GPU Reset Required", 154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", nil, F, reset},
		{"XID 154 Node Reboot Required", 154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", nil, F, reboot},
		{"XID 154 Drain P2P drains", 154, "GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", nil, F, recert},
		{"XID 154 Drain and Reset", 154, "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", nil, F, reset},
		{"XID 154 back to None", 154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", nil, I, none},
		{"XID 154 with an action NVIDIA does not list", 154, "GPU recovery action changed from 0x0 (None) to 0x9 (Something New)", nil, F, support},
		{"XID 159 with another XID is sympathetic", 159, "", []int{48}, I, none},
		{"XID 159 alone is recertified", 159, "", nil, D, recert},
		{"XID 162 is good news", 162, "", nil, I, none},
		{"XID 163 needs no reset", 163, "", nil, D, none},
		{"XID 168 boots again", 168, "", nil, F, reboot},
		{"XID 171 (DRAM detail of 48) resets", 171, "", nil, F, reset},
		{"XID 172 (SRAM detail of 48) needs field diagnostics", 172, "", nil, F, support},
		{"XID 74 needs a reset", 74, "pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)", nil, F, reset},
		{"XID 119 GSP RPC timeout resets", 119, "pid=36055, name=dcgm-exporter, Timeout after 6s of waiting for RPC response from GPU0 GSP!", nil, F, reset},
		{"XID 79 reboots", 79, "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", nil, F, reboot},
		{"XID 13 is the application's", 13, "pid=9, name=a, Graphics Exception", nil, I, none},
		{"XID 173 is unknown", 173, "", nil, F, support},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := Classify(tc.xid, tc.msg, tc.recent)
			if e.Severity != tc.severity || e.Action != tc.action {
				t.Errorf("Classify(%d, %q, %v) = %s/%s (%s: %s); want %s/%s", tc.xid, tc.msg, tc.recent, e.Severity, e.Action, e.Bucket, e.Reason, tc.severity, tc.action)
			}
			if e.Reason == "" {
				t.Errorf("Classify(%d, %q) has no reason", tc.xid, tc.msg)
			}
		})
	}
}

func TestLookupUnknown(t *testing.T) {
	g := NewWithT(t)
	for _, x := range []int{0, -1, 173, 999, 65535} {
		e := Lookup(x, "")
		g.Expect(e.Known).To(BeFalse(), "XID %d", x)
		g.Expect(e.Bucket).To(Equal("UNKNOWN"))
		g.Expect(e.Severity).To(Equal(gpuhealthv1alpha1.SeverityFatal))
		g.Expect(e.Action).To(Equal(gpuhealthv1alpha1.ActionContactSupport))
		g.Expect(e.Description).To(ContainSubstring("unknown XID"))
		g.Expect(e.Reason).To(ContainSubstring(Version))
	}
}

func TestSummaryNamesUnusedCodesByMnemonic(t *testing.T) {
	g := NewWithT(t)
	g.Expect(Lookup(1, "").Summary()).To(Equal("ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD"))
	g.Expect(Lookup(119, "").Summary()).To(Equal("GSP RPC Timeout"))
}

func TestVersion(t *testing.T) {
	g := NewWithT(t)
	g.Expect(Version).To(HavePrefix("xid-" + CatalogRevision))
	g.Expect(len(Version)).To(BeNumerically("<=", 64), "events store it in a 64-character field")
}

func validSeverity(s gpuhealthv1alpha1.Severity) bool {
	switch s {
	case gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.SeverityInfo:
		return true
	}
	return false
}

func validAction(a gpuhealthv1alpha1.Action) bool {
	switch a {
	case gpuhealthv1alpha1.ActionNone, gpuhealthv1alpha1.ActionResetGPU, gpuhealthv1alpha1.ActionRebootNode,
		gpuhealthv1alpha1.ActionRecertify, gpuhealthv1alpha1.ActionReplaceNode, gpuhealthv1alpha1.ActionContactSupport:
		return true
	}
	return false
}

func FuzzLookup(f *testing.F) {
	seeds := []string{
		"",
		"GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
		"(Drain and Reset)",
		"((()))",
		")(",
		"(\xff\xfe)",
		strings.Repeat("(", 100) + strings.Repeat(")", 99),
		"RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000004 0x00000040 0x00000000 0x00000000 0x00000000 0x00000000)",
		"NETIR Fatal XC0 i0 Link -1 (0x000fe406",
		"pid=9, name=a, Ch 00000010 caused by previous Xid 48",
		"X Fatal (0xffffffffff 0x1)",
	}
	for i, s := range seeds {
		f.Add(154, s)
		f.Add(145, s)
		f.Add(i-1, s)
	}
	f.Fuzz(func(t *testing.T, xid int, message string) {
		for _, code := range []int{xid, 45, 145, 149, 154} {
			e := Classify(code, message, []int{xid})
			if e.XID != code || !validSeverity(e.Severity) || !validAction(e.Action) || e.Description == "" || e.Reason == "" {
				t.Fatalf("Classify(%d, %q) = %+v; want a valid entry", code, message, e)
			}
		}
	})
}

// Which faults a GPU reset clears on the reporting GPU alone: a reset
// verdict, not in a shared link or fabric.
func TestPerGPU(t *testing.T) {
	cases := []struct {
		code    int
		message string
		recent  []int
		want    bool
	}{
		{48, "", nil, true}, // a double-bit ECC error: reset the GPU
		{48, "", []int{63}, true},
		{119, "", nil, true}, // GSP RPC timeout: reset the GPU
		{79, "", nil, false}, // fallen off the bus: reboot the node
		{74, "", nil, false}, // an NVLink error: the link's other end too
		{45, "", nil, false}, // a solo 45: Fabric Manager's registration
		{13, "", nil, false}, // an application's fault: nothing to reset
		{95, "", nil, true},  // uncontained ECC: reset the GPU
		{154, "GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)", nil, true},
		{154, "GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)", nil, false},
		{145, "", nil, false},   // NVLink5, whatever its row says
		{99999, "", nil, false}, // unknown: a person decides
	}
	for _, tc := range cases {
		e := Classify(tc.code, tc.message, tc.recent)
		if got := e.PerGPU(); got != tc.want {
			t.Errorf("XID %d %q (%s/%s, %s): PerGPU() = %v, want %v", tc.code, tc.message, e.Severity, e.Action, e.Bucket, got, tc.want)
		}
	}
}
