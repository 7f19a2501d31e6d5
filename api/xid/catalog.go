package xid

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// MappingVersion is the revision of gpuhealth's mapping from NVIDIA's buckets
// to severities and actions (the tables in this file). Raise it whenever a
// verdict changes.
const MappingVersion = "2"

// MaxCode is the largest XID number gpuhealth accepts: five digits, room for
// codes far past the catalog's (which ends in the 170s) that a future driver
// may print.
const MaxCode = 99999

// Version names the catalog that classified a finding: NVIDIA's catalog
// revision plus gpuhealth's mapping version. Events record it.
const Version = "xid-" + CatalogRevision + "+map." + MappingVersion

// Generations says which GPU generations NVIDIA lists an XID for.
type Generations struct {
	A100, H100, B100, GB200 bool
}

// CatalogRow is one row of NVIDIA's sheet "Xids".
type CatalogRow struct {
	// Code is the XID number.
	Code int
	// Mnemonic is the driver's name for it, for example
	// ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS.
	Mnemonic string
	// Description is NVIDIA's description ("Unused" for retired codes).
	Description string
	// AppliesTo lists the generations the code is supported on.
	AppliesTo Generations
	// Immediate is the resolution bucket for getting back into service.
	Immediate string
	// Investigatory is the resolution bucket for finding the cause.
	Investigatory string
	// XID154Linkage says whether the XID also raises XID 154.
	XID154Linkage string
}

// DecodeRow is one row of NVIDIA's sheet "Xid 144-150 Decode".
type DecodeRow struct {
	// XID is the NVLink5 XID, 144 to 150.
	XID int
	// Subcode is the unit mnemonic the line prints; "A/B" when drivers
	// before R575 print A and later ones B.
	Subcode string
	// V1IntrInfo and V2IntrInfo are the IntrInfo bit patterns, most
	// significant bit first, "-" for bits that do not matter, for drivers
	// before R575 (V1) and from R575 on (V2).
	V1IntrInfo, V2IntrInfo string
	// ErrorStatus is the error status register value, "" for any value,
	// or "a/b" for either.
	ErrorStatus string
	// Immediate is the data-center recovery action.
	Immediate string
	// V1Action2IntrInfo and V2Action2IntrInfo are patterns that, when they
	// match, make Action2 the recovery action instead.
	V1Action2IntrInfo, V2Action2IntrInfo string
	// Action2 is the recovery action for the Action2 patterns.
	Action2 string
	// Investigatory is the bucket for finding the cause.
	Investigatory string
	// Severity is NVIDIA's severity: Fatal, Link Fatal, Non-fatal.
	Severity string
	// Origin says whether the cause is hardware, software or firmware.
	Origin string
}

// Entry is gpuhealth's verdict on one XID occurrence.
type Entry struct {
	// XID is the XID number.
	XID int
	// Known is false when the XID is not in the catalog.
	Known bool
	// Mnemonic and Description are NVIDIA's words for the XID.
	Mnemonic    string
	Description string
	// Bucket is the resolution bucket that decided: the catalog's immediate
	// bucket, or the decode row's for an NVLink5 XID; "UNKNOWN" for an XID
	// the catalog does not know.
	Bucket string
	// Investigatory is the catalog's investigatory bucket.
	Investigatory string
	// AppliesTo lists the generations NVIDIA lists the XID for.
	AppliesTo Generations
	// Severity and Action are the verdict.
	Severity gpuhealthv1alpha1.Severity
	Action   gpuhealthv1alpha1.Action
	// Reason says in a sentence why this verdict.
	Reason string
}

// Summary is the entry in a few words for messages: NVIDIA's description,
// or its mnemonic where the description is "Unused".
func (e Entry) Summary() string {
	if e.Description == "" || strings.EqualFold(e.Description, "Unused") {
		if e.Mnemonic != "" {
			return e.Mnemonic
		}
	}
	return e.Description
}

// PerGPU says whether the fault can be handled on the reporting GPU alone:
// its action is a reset of that GPU, which NVIDIA says clears it, and it is
// not in what other GPUs share — an NVLink link (74, and NVLink5's 144 to
// 150 whatever their row says) or Fabric Manager's registration (a solo
// 45) — which the node's workflow handles. A fault that asks for a reboot,
// a person or nothing is not per GPU.
func (e Entry) PerGPU() bool {
	if e.Action != resetGPU || e.XID >= 144 && e.XID <= 150 {
		return false
	}
	switch e.Bucket {
	case bucketNVLinkErr, bucketNVLink5, bucketXID45:
		return false
	}
	return true
}

// verdict is a severity and action with the reason for them.
type verdict struct {
	severity gpuhealthv1alpha1.Severity
	action   gpuhealthv1alpha1.Action
	reason   string
}

const (
	fatal    = gpuhealthv1alpha1.SeverityFatal
	degraded = gpuhealthv1alpha1.SeverityDegraded
	info     = gpuhealthv1alpha1.SeverityInfo

	none           = gpuhealthv1alpha1.ActionNone
	resetGPU       = gpuhealthv1alpha1.ActionResetGPU
	rebootNode     = gpuhealthv1alpha1.ActionRebootNode
	recertify      = gpuhealthv1alpha1.ActionRecertify
	contactSupport = gpuhealthv1alpha1.ActionContactSupport
)

// Bucket names the code refers to.
const (
	bucketUnknown   = "UNKNOWN"
	bucketXID45     = "WORKFLOW_XID_45"
	bucketXID48     = "WORKFLOW_XID_48"
	bucketNVLink5   = "WORKFLOW_NVLINK5_ERR"
	bucketNVLinkErr = "WORKFLOW_NVLINK_ERR"
	bucketXID154    = "XID_154"
	bucketCheckUVM  = "CHECK_UVM"
	bucket154Eval   = "XID_154_EVAL"
	bucketResetGPU  = "RESET_GPU"
	bucketIgnore    = "IGNORE"
	bucketNoBucket  = "NO_BUCKET"
	bucketRestartBM = "RESTART_BM"
)

// buckets maps NVIDIA's immediate resolution buckets (and the decode sheet's
// recovery actions) to a verdict. gpuhealth always drains a node before a
// reset, so NVIDIA's RESET_GPU and DRAIN_AND_RESET are both ResetGPU.
var buckets = map[string]verdict{
	bucketResetGPU:      {fatal, resetGPU, "NVIDIA's recovery action is a GPU reset (RESET_GPU)"},
	bucketXID48:         {fatal, resetGPU, "an uncorrectable ECC error: NVIDIA's workflow is a GPU reset, with XID 63 or 64 a drain and reset (WORKFLOW_XID_48)"},
	bucketRestartBM:     {fatal, rebootNode, "NVIDIA's recovery action is a bare-metal restart (RESTART_BM)"},
	"RESTART_VM":        {fatal, rebootNode, "NVIDIA's recovery action is a restart of the VM, which on bare metal is the node (RESTART_VM)"},
	"CONTACT_SUPPORT":   {fatal, contactSupport, "NVIDIA says to contact support (CONTACT_SUPPORT)"},
	"CHECK_MECHANICALS": {fatal, contactSupport, "NVIDIA says to check seating and connections, which needs a person (CHECK_MECHANICALS)"},
	"UPDATE_SWFW":       {fatal, contactSupport, "NVIDIA says to update software and firmware, which needs a person (UPDATE_SWFW)"},
	bucketNVLinkErr: {fatal, resetGPU,
		"an NVLink error: NVIDIA says a GPU reset or node reboot is needed to clear it (WORKFLOW_NVLINK_ERR)"},
	"RESTART_APP":  {info, none, "an application fault: NVIDIA's action is to restart the application, not the GPU (RESTART_APP)"},
	bucketIgnore:   {info, none, "NVIDIA says no action is required (IGNORE)"},
	bucket154Eval:  {info, none, "the XID 154 reported with it carries the recovery action; without one NVIDIA's action is to restart the application (XID_154_EVAL)"},
	bucketNoBucket: {fatal, contactSupport, "the catalog gives no resolution bucket, so a person decides"},
}

// noBucket holds gpuhealth's verdict for the XIDs the catalog lists without
// a resolution bucket, read from NVIDIA's description and trigger conditions.
var noBucket = map[int]verdict{
	162: {info, none, "power smoothing capability re-engaged: good news, nothing to do"},
	163: {degraded, none, "power smoothing disengaged: NVIDIA says no GPU reset is required; it stays off until the thermal events are resolved"},
	164: {degraded, none, "power smoothing hardware near the end of its lifetime: NVIDIA says to monitor power swings and plan replacement"},
	165: {degraded, none, "power smoothing hardware lifetime exhausted: NVIDIA says to replace the GPU only if power swings are not acceptable"},
	166: {fatal, contactSupport, "confidential-computing traffic before the link was set up for encryption: no recovery action in the catalog"},
	167: {fatal, contactSupport, "PCIe fatal timeout: no recovery action in the catalog"},
	168: {fatal, rebootNode, "errors in the write-protected region: NVIDIA says to enable ECC or boot again with a shifted WPR"},
	169: {fatal, resetGPU, "internal micro-controller (SEC2) halt: treated like XID 62, the PMU halt, which NVIDIA resets"},
	170: {fatal, contactSupport, "interrupt seen in confidential-computing mode: no recovery action in the catalog"},
	171: {fatal, resetGPU, "uncorrectable DRAM error, the detail of an XID 48: NVIDIA's XID 48 guidance for frame buffer errors is a reset, after which row remapping (XID 63/64) takes effect"},
	172: {fatal, contactSupport, "uncorrectable SRAM error, the detail of an XID 48: NVIDIA says to check the SRAM error threshold and run field diagnostics, past what a reset fixes"},
}

// rows is the catalog by XID.
var rows = func() map[int]CatalogRow {
	m := make(map[int]CatalogRow, len(catalogRows))
	for _, r := range catalogRows {
		m[r.Code] = r
	}
	return m
}()

// Lookup returns the verdict on one XID from the catalog alone: Classify
// with no other XIDs seen on the GPU.
func Lookup(code int, message string) Entry {
	return Classify(code, message, nil)
}

// Classify returns the verdict on one XID occurrence. message is the text of
// the driver's line after the XID number (empty when the source has none,
// as with NVML events); recent are the other XIDs reported on the same GPU
// shortly before it, which NVIDIA's workflows for XID 45 and 48 consult.
// An XID the catalog does not know is Fatal with ContactSupport.
func Classify(code int, message string, recent []int) Entry {
	r, ok := rows[code]
	if !ok || code <= 0 {
		return Entry{
			XID: code, Bucket: bucketUnknown, Severity: fatal, Action: contactSupport,
			Description: fmt.Sprintf("unknown XID %d", code),
			Reason:      fmt.Sprintf("XID %d is not in NVIDIA's catalog (%s), so a person decides", code, Version),
		}
	}
	e := Entry{
		XID: code, Known: true, Mnemonic: r.Mnemonic, Description: r.Description,
		Bucket: r.Immediate, Investigatory: r.Investigatory, AppliesTo: r.AppliesTo,
	}
	if e.Bucket == "" {
		e.Bucket = bucketNoBucket
	}
	var v verdict
	switch e.Bucket {
	case bucketXID45:
		v = xid45(message, recent)
	case bucketNVLink5:
		v, e.Bucket = decodeNVLink5(code, message)
	case bucketXID154:
		v = xid154(message)
	case bucketCheckUVM:
		v = checkUVM(recent)
	case bucketXID48:
		v = buckets[bucketXID48]
		if slices.Contains(recent, 63) || slices.Contains(recent, 64) {
			v.reason = "an uncorrectable ECC error with XID 63/64: NVIDIA's workflow is a drain and reset (WORKFLOW_XID_48)"
		}
	case bucketNoBucket:
		var ok bool
		if v, ok = noBucket[code]; !ok {
			v = buckets[bucketNoBucket]
		}
	default:
		var ok bool
		if v, ok = buckets[e.Bucket]; !ok {
			v = verdict{fatal, contactSupport, fmt.Sprintf("bucket %s has no mapping in gpuhealth, so a person decides", e.Bucket)}
		}
	}
	e.Severity, e.Action, e.Reason = v.severity, v.action, v.reason
	return e
}

// ReadsMessage says whether what an XID means depends on the driver's line
// (the NVLink5 registers of 144 to 150, the recovery action of 154), which
// only the kernel log carries.
func ReadsMessage(code int) bool { return code == 154 || code >= 144 && code <= 150 }

// JudgedPerOccurrence says whether the verdict on an XID can differ from one
// occurrence to the next: it is read from the line (ReadsMessage) or from the
// XIDs reported with it (45, 159; XID 48 is a reset either way).
func JudgedPerOccurrence(code int) bool {
	return ReadsMessage(code) || code == 45 || code == 159
}

// EventName is the name of the NodeHealthEvent that records a finding: the
// spec's EventName, with the verdict in the identity for an XID judged per
// occurrence, so that each verdict is its own event.
func EventName(s *gpuhealthv1alpha1.NodeHealthEventSpec) string {
	if s.Check == gpuhealthv1alpha1.CheckXID {
		if n, err := strconv.Atoi(s.Code); err == nil && JudgedPerOccurrence(n) {
			return s.VerdictEventName()
		}
	}
	return s.EventName()
}

// causedBy matches the text newer drivers append to XID 45.
var causedBy = regexp.MustCompile(`(?i)caused by previous xid (\d+)`)

// xid45 is NVIDIA's WORKFLOW_XID_45: "Solo: RESTART_FM; not solo: IGNORE
// (follow the other XID)".
func xid45(message string, recent []int) verdict {
	if m := causedBy.FindStringSubmatch(message); m != nil {
		return verdict{info, none, fmt.Sprintf("cleanup after XID %s, which decides (WORKFLOW_XID_45, not solo)", m[1])}
	}
	for _, c := range recent {
		if c != 45 {
			return verdict{info, none, fmt.Sprintf("cleanup after XID %d on the same GPU, which decides (WORKFLOW_XID_45, not solo)", c)}
		}
	}
	return verdict{fatal, resetGPU, "a solo XID 45: NVIDIA says to restart Fabric Manager (WORKFLOW_XID_45); gpuhealth drains the node and resets the GPU, which re-registers it with Fabric Manager, and recertification proves it"}
}

// checkUVM is NVIDIA's CHECK_UVM: "if UVM/vGPU is used, RESET_GPU;
// otherwise IGNORE", and the investigatory SYMPATHETIC_REPORT_SOLO.
func checkUVM(recent []int) verdict {
	if len(recent) > 0 {
		return verdict{info, none, fmt.Sprintf("a sympathetic report of XID %d on the same GPU, which decides (CHECK_UVM)", recent[len(recent)-1])}
	}
	return verdict{degraded, recertify, "a solo CHI non-data error: NVIDIA resets when unified memory is in use (CHECK_UVM); gpuhealth cannot tell, so recertification checks the GPU when the policy acts on it"}
}

// The driver's recovery actions, by the value XID 154 prints: the
// driver's NV2080_CTRL_GPU_RECOVERY_ACTION enum, which NVML publishes as
// nvmlDeviceGpuRecoveryAction_t (the FI_DEV_GET_GPU_RECOVERY_ACTION field).
// The words beside the value changed between driver branches (R610 prints
// "PF FLR" and "OS Reboot" where earlier ones printed "GPU Reset Required"
// and "Node Reboot Required"); the value did not, so it decides.
const (
	recoveryNone              = 0
	recoveryGPUReset          = 1
	recoveryNodeReboot        = 2
	recoveryDrainP2P          = 3
	recoveryDrainAndReset     = 4
	recoveryRecoverIMEXDomain = 5
	recoveryBusReset          = 6
	recoverySystemReboot      = 7
)

// recoveryWords are the words drivers print beside each value, for a line
// that carries words only.
var recoveryWords = map[string]int{
	"none":                 recoveryNone,
	"gpu reset required":   recoveryGPUReset,
	"pf flr":               recoveryGPUReset,
	"node reboot required": recoveryNodeReboot,
	"os reboot":            recoveryNodeReboot,
	"drain p2p":            recoveryDrainP2P,
	"drain and reset":      recoveryDrainAndReset,
}

// recoveryTo finds the value the action changed to ("… to 0x2 (OS
// Reboot)"), else the words in the last parentheses; -1 when the line
// carries neither in a form gpuhealth knows.
var recoveryTo = regexp.MustCompile(`(?i)\bto\s+0x([0-9a-f]{1,8})\b`)

func recoveryAction(message string) int {
	if m := recoveryTo.FindStringSubmatch(message); m != nil {
		if v, err := strconv.ParseUint(m[1], 16, 32); err == nil {
			return int(v)
		}
	}
	if v, ok := recoveryWords[strings.ToLower(lastParenthesised(message))]; ok {
		return v
	}
	return -1
}

// xid154 reads the driver's recovery action from the line: by value, on
// every driver's wording (recoveryAction).
func xid154(message string) verdict {
	switch v := recoveryAction(message); v {
	case recoveryNone:
		return verdict{info, none, "the driver's recovery action is none (XID 154)"}
	case recoveryGPUReset:
		return verdict{fatal, resetGPU, "the driver's recovery action is a GPU reset (XID 154, 0x1)"}
	case recoveryDrainAndReset:
		return verdict{fatal, resetGPU, "the driver's recovery action is drain and reset; gpuhealth drains before every reset (XID 154, 0x4)"}
	case recoveryNodeReboot:
		return verdict{fatal, rebootNode, "the driver's recovery action is a node reboot (XID 154, 0x2)"}
	case recoverySystemReboot:
		return verdict{fatal, rebootNode, "the driver's recovery action is a system reboot (XID 154, 0x7)"}
	case recoveryBusReset:
		return verdict{fatal, rebootNode, "the driver's recovery action is a PCIe bus reset, which gpuhealth's GPU reset does not do; a reboot resets the bus (XID 154, 0x6)"}
	case recoveryDrainP2P:
		return verdict{fatal, recertify, "the driver's recovery action is to drain peer-to-peer work: gpuhealth drains the node and recertification proves the links before it returns (XID 154, 0x3)"}
	case recoveryRecoverIMEXDomain:
		return verdict{fatal, contactSupport, "the driver's recovery action is to recover the IMEX domain, which spans nodes: a person decides (XID 154, 0x5)"}
	case -1:
		return verdict{fatal, contactSupport, "the line names no recovery action gpuhealth can read for XID 154, so a person decides"}
	default:
		return verdict{fatal, contactSupport, fmt.Sprintf("the driver's recovery action 0x%x is newer than gpuhealth knows (XID 154), so a person decides", v)}
	}
}

// lastParenthesised returns the trimmed text inside the last balanced pair
// of parentheses in s, or "" when s has none.
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

// Entries returns the verdict on every XID of the catalog from the catalog
// alone (no line, no other XIDs), in catalog order.
func Entries() []Entry {
	out := make([]Entry, 0, len(catalogRows))
	for _, r := range catalogRows {
		out = append(out, Lookup(r.Code, ""))
	}
	return out
}

// Rows returns NVIDIA's catalog rows, in sheet order.
func Rows() []CatalogRow { return slices.Clone(catalogRows) }

// DecodeRows returns NVIDIA's NVLink5 decode rows, in sheet order.
func DecodeRows() []DecodeRow { return slices.Clone(decodeRows) }
