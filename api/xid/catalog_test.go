package xid

import (
	"sort"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

func TestLookupBuckets(t *testing.T) {
	cases := []struct {
		name     string
		xid      int
		bucket   string
		severity gpuhealthv1alpha1.Severity
		action   gpuhealthv1alpha1.Action
	}{
		{"XID 46 is in RESET_GPU and resets the GPU.", 46, "RESET_GPU", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionResetGPU},
		{"XID 158 is the last RESET_GPU entry and resets the GPU.", 158, "RESET_GPU", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionResetGPU},
		{"XID 48 is a double-bit ECC error and resets the GPU.", 48, "WORKFLOW_XID_48", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionResetGPU},
		{"XID 79 is a GPU fallen off the bus and reboots the node.", 79, "RESTART_BM", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode},
		{"XID 151 is a key rotation error and reboots the node.", 151, "RESTART_VM", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode},
		{"XID 1 starts the first CONTACT_SUPPORT range.", 1, "CONTACT_SUPPORT", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"XID 7 ends the first CONTACT_SUPPORT range.", 7, "CONTACT_SUPPORT", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"XID 15 starts a CONTACT_SUPPORT range.", 15, "CONTACT_SUPPORT", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"XID 24 ends a CONTACT_SUPPORT range.", 24, "CONTACT_SUPPORT", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"XID 111 starts the 111 to 118 CONTACT_SUPPORT range.", 111, "CONTACT_SUPPORT", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"XID 118 ends the 111 to 118 CONTACT_SUPPORT range.", 118, "CONTACT_SUPPORT", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"XID 142 is the last CONTACT_SUPPORT entry.", 142, "CONTACT_SUPPORT", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"XID 45 follows the catalog and contacts support.", 45, "WORKFLOW_XID_45", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"XID 54 asks to check the mechanicals.", 54, "CHECK_MECHANICALS", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"XID 74 is an NVLink error and contacts support.", 74, "WORKFLOW_NVLINK_ERR", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"XID 78 asks to update software or firmware.", 78, "UPDATE_SWFW", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"XID 144 starts the NVLink5 range and is degraded.", 144, "WORKFLOW_NVLINK5_ERR", gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify},
		{"XID 150 ends the NVLink5 range and is degraded.", 150, "WORKFLOW_NVLINK5_ERR", gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify},
		{"XID 154 without a message contacts support.", 154, "XID_154", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"XID 159 asks to check UVM.", 159, "CHECK_UVM", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"XID 162 starts the range without a bucket.", 162, "NO_BUCKET", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"XID 172 ends the range without a bucket.", 172, "NO_BUCKET", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"XID 13 is an application fault and needs nothing.", 13, "RESTART_APP", gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone},
		{"XID 31 is an application fault and needs nothing.", 31, "RESTART_APP", gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone},
		{"XID 96 starts an application range and needs nothing.", 96, "RESTART_APP", gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone},
		{"XID 135 ends an application range and needs nothing.", 135, "RESTART_APP", gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone},
		{"XID 43 is ignored by the catalog.", 43, "IGNORE", gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone},
		{"XID 106 starts an ignored range.", 106, "IGNORE", gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone},
		{"XID 108 ends an ignored range.", 108, "IGNORE", gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone},
		{"XID 161 is ignored by the catalog.", 161, "IGNORE", gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := Lookup(tc.xid, "")
			g.Expect(e.XID).To(Equal(tc.xid))
			g.Expect(e.Known).To(BeTrue())
			g.Expect(e.Bucket).To(Equal(tc.bucket))
			g.Expect(e.Severity).To(Equal(tc.severity))
			g.Expect(e.Action).To(Equal(tc.action))
			g.Expect(e.Description).NotTo(BeEmpty())
		})
	}
}

func TestLookupDescriptions(t *testing.T) {
	cases := []struct {
		name string
		xid  int
		want string
	}{
		{"XID 79 says the GPU has fallen off the bus.", 79, "GPU has fallen off the bus"},
		{"XID 48 says it is a double-bit ECC error.", 48, "double-bit ECC"},
		{"XID 45 says many operators ignore it.", 45, "many operators ignore it"},
		{"XID 45 says policy rules can override it.", 45, "policy rules can override"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(Lookup(tc.xid, "").Description).To(ContainSubstring(tc.want))
		})
	}
}

func TestLookupXID154(t *testing.T) {
	const prefix = "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to "
	cases := []struct {
		name     string
		message  string
		severity gpuhealthv1alpha1.Severity
		action   gpuhealthv1alpha1.Action
	}{
		{"GPU Reset Required resets the GPU.", prefix + "0x1 (GPU Reset Required)", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionResetGPU},
		{"Drain and Reset resets the GPU.", prefix + "0x4 (Drain and Reset)", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionResetGPU},
		{"Node Reboot Required reboots the node.", prefix + "0x2 (Node Reboot Required)", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode},
		{"None needs nothing.", "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone},
		{"An unknown recovery action contacts support.", prefix + "0x9 (Something New)", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"A message without parentheses contacts support.", "GPU recovery action changed", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"An empty message contacts support.", "", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
		{"Only the last parenthesised text counts.", "(Node Reboot Required) then (None)", gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone},
		{"Text after the last parentheses is ignored.", prefix + "0x2 (Node Reboot Required).", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode},
		{"Case and spaces inside the parentheses do not matter.", prefix + "0x1 ( gpu reset required )", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionResetGPU},
		{"An unclosed parenthesis does not count.", "(None) (Node Reboot", gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone},
		{"A closing parenthesis without an opening one contacts support.", "None)", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := Lookup(154, tc.message)
			g.Expect(e.Known).To(BeTrue())
			g.Expect(e.Bucket).To(Equal("XID_154"))
			g.Expect(e.Severity).To(Equal(tc.severity))
			g.Expect(e.Action).To(Equal(tc.action))
			g.Expect(e.Description).To(ContainSubstring("GPU recovery action changed"))
		})
	}
}

func TestLookupIgnoresMessageForOtherXIDs(t *testing.T) {
	g := NewWithT(t)
	e := Lookup(79, "(None)")
	g.Expect(e.Action).To(Equal(gpuhealthv1alpha1.ActionRebootNode))
	g.Expect(e.Severity).To(Equal(gpuhealthv1alpha1.SeverityFatal))
}

func TestLookupUnknown(t *testing.T) {
	cases := []struct {
		name string
		xid  int
	}{
		{"XID 999 is not in the catalog.", 999},
		{"XID 0 is not a valid XID.", 0},
		{"XID -1 is not a valid XID.", -1},
		{"XID 173 is just past the end of the catalog.", 173},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := Lookup(tc.xid, "(None)")
			g.Expect(e.XID).To(Equal(tc.xid))
			g.Expect(e.Known).To(BeFalse())
			g.Expect(e.Severity).To(Equal(gpuhealthv1alpha1.SeverityFatal))
			g.Expect(e.Action).To(Equal(gpuhealthv1alpha1.ActionContactSupport))
			g.Expect(e.Description).To(ContainSubstring("unknown XID"))
		})
	}
}

func TestCatalogRows(t *testing.T) {
	t.Run("No XID appears twice in the catalog rows.", func(t *testing.T) {
		g := NewWithT(t)
		seen := map[int]string{}
		for _, r := range rows {
			for _, x := range r.xids {
				g.Expect(seen).NotTo(HaveKey(x), "XID %d is in %s and %s", x, seen[x], r.bucket)
				seen[x] = r.bucket
			}
		}
		g.Expect(table).To(HaveLen(len(seen)))
	})
	t.Run("Every named XID is in the catalog.", func(t *testing.T) {
		g := NewWithT(t)
		for x := range names {
			g.Expect(table).To(HaveKey(x))
		}
	})
	t.Run("Every XID from 1 to 172 is known, as the reference table has no gaps.", func(t *testing.T) {
		g := NewWithT(t)
		for x := 1; x <= 172; x++ {
			g.Expect(Lookup(x, "").Known).To(BeTrue(), "XID %d", x)
		}
	})
}

func TestEntries(t *testing.T) {
	t.Run("Entries are sorted by XID without repeats.", func(t *testing.T) {
		g := NewWithT(t)
		es := Entries()
		g.Expect(es).To(HaveLen(len(table)))
		g.Expect(sort.SliceIsSorted(es, func(i, j int) bool { return es[i].XID < es[j].XID })).To(BeTrue())
		for i := 1; i < len(es); i++ {
			g.Expect(es[i].XID).To(BeNumerically(">", es[i-1].XID))
		}
	})
	t.Run("Every entry is known, valid and matches Lookup without a message.", func(t *testing.T) {
		g := NewWithT(t)
		for _, e := range Entries() {
			g.Expect(e.Known).To(BeTrue())
			g.Expect(e.Bucket).NotTo(BeEmpty())
			g.Expect(e.Description).NotTo(BeEmpty())
			g.Expect(validSeverity(e.Severity)).To(BeTrue())
			g.Expect(validAction(e.Action)).To(BeTrue())
			g.Expect(Lookup(e.XID, "")).To(Equal(e))
		}
	})
	t.Run("Changing the returned slice does not change the catalog.", func(t *testing.T) {
		g := NewWithT(t)
		es := Entries()
		es[0].Action = gpuhealthv1alpha1.ActionReplaceNode
		g.Expect(Entries()[0].Action).NotTo(Equal(gpuhealthv1alpha1.ActionReplaceNode))
	})
}

func TestVersion(t *testing.T) {
	g := NewWithT(t)
	g.Expect(Version).To(HavePrefix("xid-catalog/"))
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
		"NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
		"GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
		"(Drain and Reset)",
		"(None)",
		"((()))",
		")(",
		"(",
		")",
		"(\xff\xfe)",
		strings.Repeat("(", 100) + strings.Repeat(")", 99),
	}
	for i, s := range seeds {
		f.Add(154, s)
		f.Add(i-1, s)
	}
	f.Fuzz(func(t *testing.T, xid int, message string) {
		e := Lookup(154, message)
		if !e.Known || e.XID != 154 {
			t.Fatalf("Lookup(154, %q) = %+v; want a known XID 154 entry", message, e)
		}
		if !validSeverity(e.Severity) || !validAction(e.Action) {
			t.Fatalf("Lookup(154, %q) = %+v; want a valid severity and action", message, e)
		}
		e = Lookup(xid, message)
		if e.XID != xid || !validSeverity(e.Severity) || !validAction(e.Action) || e.Description == "" {
			t.Fatalf("Lookup(%d, %q) = %+v; want a valid entry", xid, message, e)
		}
	})
}
