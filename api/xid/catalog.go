package xid

import (
	"fmt"
	"sort"
	"strings"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// Version names this revision of the catalog; events record it so that one can
// tell which table classified them.
const Version = "xid-catalog/2026-11"

// Entry is what the catalog says about one XID.
type Entry struct {
	// XID is the XID number.
	XID int
	// Bucket is the catalog's resolution bucket, for example "RESTART_BM".
	// It is "NO_BUCKET" for XIDs the catalog revision lists without a bucket
	// and "UNKNOWN" for XIDs that are not in the catalog.
	Bucket string
	// Severity is how bad the XID is by default.
	Severity gpuhealthv1alpha1.Severity
	// Action is the recommended action by default.
	Action gpuhealthv1alpha1.Action
	// Known is false when the XID is not in the catalog.
	Known bool
	// Description is a few words about the XID, or the bucket's meaning when
	// the catalog has no words for it.
	Description string
}

// Bucket names that the code refers to by name.
const (
	bucketUnknown  = "UNKNOWN"
	bucketXID154   = "XID_154"
	bucketNVLink5  = "WORKFLOW_NVLINK5_ERR"
	bucketNoBucket = "NO_BUCKET"
)

// row is one bucket row of the catalog: every XID in it shares the bucket,
// the default severity and action, and the bucket's meaning.
type row struct {
	bucket   string
	severity gpuhealthv1alpha1.Severity
	action   gpuhealthv1alpha1.Action
	meaning  string
	xids     []int
}

// span returns the XIDs from first to last, both included.
func span(first, last int) []int {
	out := make([]int, 0, last-first+1)
	for x := first; x <= last; x++ {
		out = append(out, x)
	}
	return out
}

// list joins single XIDs and spans into one list.
func list(parts ...[]int) []int {
	var out []int
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// one is a single XID as a list, for use with list.
func one(x int) []int { return []int{x} }

// rows is the catalog, row by row, as NVIDIA's published XID catalog
// ("Resolution Bucket (Immediate Action)") is read into our actions.
var rows = []row{
	{
		bucket: "RESET_GPU", severity: gpuhealthv1alpha1.SeverityFatal, action: gpuhealthv1alpha1.ActionResetGPU,
		meaning: "the catalog says to reset the GPU",
		xids:    []int{46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158},
	},
	{
		bucket: "WORKFLOW_XID_48", severity: gpuhealthv1alpha1.SeverityFatal, action: gpuhealthv1alpha1.ActionResetGPU,
		meaning: "double-bit ECC error; the catalog says to reset the GPU",
		xids:    []int{48},
	},
	{
		bucket: "RESTART_BM", severity: gpuhealthv1alpha1.SeverityFatal, action: gpuhealthv1alpha1.ActionRebootNode,
		meaning: "the catalog says to restart the bare-metal node",
		xids:    []int{79},
	},
	{
		bucket: "RESTART_VM", severity: gpuhealthv1alpha1.SeverityFatal, action: gpuhealthv1alpha1.ActionRebootNode,
		meaning: "key rotation error; the catalog says to restart the virtual machine",
		xids:    []int{151},
	},
	{
		bucket: "CONTACT_SUPPORT", severity: gpuhealthv1alpha1.SeverityFatal, action: gpuhealthv1alpha1.ActionContactSupport,
		meaning: "the catalog says to contact support",
		xids: list(
			span(1, 7), one(9), one(10), one(12), span(15, 24), span(26, 30), span(33, 36),
			one(42), one(47), span(49, 53), span(55, 59), one(61), one(65), one(73), one(81),
			one(87), one(90), one(91), span(111, 118), span(122, 125), one(138), one(142),
		),
	},
	{
		bucket: "WORKFLOW_XID_45", severity: gpuhealthv1alpha1.SeverityFatal, action: gpuhealthv1alpha1.ActionContactSupport,
		meaning: "preemptive cleanup after earlier errors",
		xids:    []int{45},
	},
	{
		bucket: "CHECK_MECHANICALS", severity: gpuhealthv1alpha1.SeverityFatal, action: gpuhealthv1alpha1.ActionContactSupport,
		meaning: "the catalog says to check the mechanicals (power, cabling, seating)",
		xids:    []int{54},
	},
	{
		bucket: "WORKFLOW_NVLINK_ERR", severity: gpuhealthv1alpha1.SeverityFatal, action: gpuhealthv1alpha1.ActionContactSupport,
		meaning: "NVLink error; decoding its registers would refine the action",
		xids:    []int{74},
	},
	{
		bucket: "UPDATE_SWFW", severity: gpuhealthv1alpha1.SeverityFatal, action: gpuhealthv1alpha1.ActionContactSupport,
		meaning: "the catalog says to update the software or firmware",
		xids:    []int{78},
	},
	{
		// The catalog decodes each NVLink5 message to choose between Fatal and
		// Degraded. That register decode is not implemented here, so every
		// XID in this row takes the catalog's no-match outcome: Degraded, and
		// recertify so the links are checked and counted.
		bucket: bucketNVLink5, severity: gpuhealthv1alpha1.SeverityDegraded, action: gpuhealthv1alpha1.ActionRecertify,
		meaning: "NVLink5 error; the message is not decoded, so it is treated as degraded",
		xids:    span(144, 150),
	},
	{
		// Lookup decides 154 from its message; this is the outcome when the
		// message names no recovery action that the catalog knows.
		bucket: bucketXID154, severity: gpuhealthv1alpha1.SeverityFatal, action: gpuhealthv1alpha1.ActionContactSupport,
		meaning: "GPU recovery action changed",
		xids:    []int{154},
	},
	{
		bucket: "CHECK_UVM", severity: gpuhealthv1alpha1.SeverityFatal, action: gpuhealthv1alpha1.ActionContactSupport,
		meaning: "the catalog says to check the unified memory (UVM) driver",
		xids:    []int{159},
	},
	{
		bucket: bucketNoBucket, severity: gpuhealthv1alpha1.SeverityFatal, action: gpuhealthv1alpha1.ActionContactSupport,
		meaning: "listed without a bucket in this catalog revision; treated as contact support",
		xids:    span(162, 172),
	},
	{
		bucket: "RESTART_APP", severity: gpuhealthv1alpha1.SeverityInfo, action: gpuhealthv1alpha1.ActionNone,
		meaning: "application-level fault; the catalog says to restart the application",
		xids: list(
			one(8), one(11), one(13), one(25), one(31), one(32), span(39, 41), one(60),
			span(68, 72), span(75, 77), one(80), span(82, 86), one(88), one(89), one(94),
			span(96, 105), span(126, 135), one(139),
		),
	},
	{
		bucket: "IGNORE", severity: gpuhealthv1alpha1.SeverityInfo, action: gpuhealthv1alpha1.ActionNone,
		meaning: "the catalog says no action is needed",
		xids: list(
			one(14), one(37), one(38), one(43), one(44), one(63), one(66), one(67), one(92),
			one(93), span(106, 108), one(121), one(137), one(141), one(152), one(153),
			one(157), one(160), one(161),
		),
	},
}

// names holds short words for the XIDs whose meaning is well known; the
// others are described by their bucket's meaning.
var names = map[int]string{
	1:   "invalid or corrupted push buffer stream",
	2:   "invalid or corrupted push buffer stream",
	3:   "invalid or corrupted push buffer stream",
	6:   "invalid or corrupted push buffer stream",
	7:   "invalid or corrupted push buffer address",
	8:   "GPU stopped processing",
	9:   "driver error programming GPU",
	12:  "driver error handling GPU exception",
	13:  "graphics engine exception",
	31:  "GPU memory page fault",
	43:  "GPU stopped processing",
	45:  "preemptive cleanup after earlier errors; many operators ignore it because it follows a killed process, and policy rules can override it",
	48:  "double-bit ECC error",
	54:  "auxiliary power is not connected to the GPU board",
	63:  "ECC page retirement or row remapping recording event",
	64:  "ECC page retirement or row remapping recording failure",
	74:  "NVLink error; decoding its registers would refine the action",
	79:  "GPU has fallen off the bus",
	92:  "high single-bit ECC error rate",
	94:  "contained ECC error",
	95:  "uncontained ECC error",
	110: "security fault error",
	151: "key rotation error",
	154: "GPU recovery action changed; the action is read from the message, and is contact support when the message names none that the catalog knows",
}

// table is the catalog by XID, built once from rows and names.
var table = buildTable()

// buildTable turns rows into a map by XID. A duplicate XID is a mistake in
// rows, so it stops the program at start-up; a test guards against it.
func buildTable() map[int]Entry {
	t := make(map[int]Entry)
	for _, r := range rows {
		for _, x := range r.xids {
			if prev, ok := t[x]; ok {
				panic(fmt.Sprintf("xid catalog: XID %d is in both bucket %s and bucket %s", x, prev.Bucket, r.bucket))
			}
			desc := r.meaning
			if n, ok := names[x]; ok {
				desc = n
			}
			t[x] = Entry{
				XID:         x,
				Bucket:      r.bucket,
				Severity:    r.severity,
				Action:      r.action,
				Known:       true,
				Description: desc,
			}
		}
	}
	return t
}

// Lookup returns what the catalog says about an XID. The message is the text
// of the kernel log line or event; only XID 154 uses it, to read the recovery
// action the driver asks for. An XID that is not in the catalog (or is zero or
// negative) is reported with Known false, severity Fatal and action
// ContactSupport.
func Lookup(xid int, message string) Entry {
	e, ok := table[xid]
	if !ok || xid <= 0 {
		return Entry{
			XID:         xid,
			Bucket:      bucketUnknown,
			Severity:    gpuhealthv1alpha1.SeverityFatal,
			Action:      gpuhealthv1alpha1.ActionContactSupport,
			Known:       false,
			Description: fmt.Sprintf("unknown XID %d: it is not in catalog %s, so contact support", xid, Version),
		}
	}
	if ReadsMessage(xid) {
		return decode154(e, message)
	}
	return e
}

// ReadsMessage says whether what an XID means depends on the driver's
// message (XID 154's recovery action), which only the kernel log carries.
func ReadsMessage(xid int) bool { return xid == 154 }

// decode154 sets the severity and action of an XID 154 entry from the
// recovery action in the message's last parenthesised text, for example
// "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)".
func decode154(e Entry, message string) Entry {
	switch strings.ToLower(lastParenthesised(message)) {
	case "gpu reset required", "drain and reset":
		e.Severity, e.Action = gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionResetGPU
		e.Description = "GPU recovery action changed; the driver asks for a GPU reset"
	case "node reboot required":
		e.Severity, e.Action = gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode
		e.Description = "GPU recovery action changed; the driver asks for a node reboot"
	case "none":
		e.Severity, e.Action = gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone
		e.Description = "GPU recovery action changed; the driver asks for nothing"
	default:
		// Keep the table's outcome: Fatal and contact support.
	}
	return e
}

// lastParenthesised returns the trimmed text inside the last balanced pair
// of parentheses in s, or "" when s has none. Text after the last closing
// parenthesis is ignored; nested parentheses stay part of the text.
func lastParenthesised(s string) string {
	end := strings.LastIndexByte(s, ')')
	if end < 0 {
		return ""
	}
	depth := 0
	for i := end; i >= 0; i-- {
		switch s[i] {
		case ')':
			depth++
		case '(':
			depth--
			if depth == 0 {
				return strings.TrimSpace(s[i+1 : end])
			}
		}
	}
	return ""
}

// Entries returns every XID in the catalog, sorted by XID. XID 154 appears
// with the outcome for a message that names no known recovery action.
func Entries() []Entry {
	out := make([]Entry, 0, len(table))
	for _, e := range table {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].XID < out[j].XID })
	return out
}
