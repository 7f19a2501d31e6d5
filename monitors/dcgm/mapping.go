package dcgm

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// How DCGM signals become findings. All findings have Source dcgm. "Event"
// rows are reported as they arrive and never resolve (like an XID from any
// source); "condition" rows are reported when they start, again at most every
// RepeatInterval while they hold, and once Resolved when they end.
//
//	DCGM signal                           Check         Component                     Code                                   Severity  Action     Kind
//	XID policy violation                  XID           GPU <UUID>                    XID number, "79"                       (empty: the pipeline classifies from api/xid)  event
//	XID 154 policy violation              XID           GPU <UUID>                    "154"                                  from field 1523 when it asks for a reset or reboot, else empty  event
//	NVLink policy violation, link field   NVLinkErrors  NVLink <UUID>/link-<n>        total counter name (*)                 Degraded  Recertify  event
//	NVLink policy violation, total field  NVLinkErrors  GPU <UUID>                    counter name (*)                       Degraded  Recertify  event
//	fields 409/419/429/439 rate > limit   NVLinkErrors  GPU <UUID>                    counter name (*)                       Degraded  Recertify  condition: resolves when a full window is at or under the limit
//	field 1502 = DOWN                     IMEXDomain    IMEX domain                   DOWN                                   Fatal     Recertify  condition: resolves on UP, DEGRADED or not applicable
//	field 1502 = DEGRADED                 IMEXDomain    IMEX domain                   DEGRADED                               Degraded  Recertify  condition: resolves on UP, DOWN or not applicable
//	field 1502 NOT_INSTALLED, NOT_CONFIGURED, UNAVAILABLE: not applicable, never a finding; resolves both
//	field 1503 0..7 except 5 (READY)      IMEXDaemon    IMEX daemon                   NOT_READY                              Degraded  Recertify  condition: resolves on READY or not applicable
//	field 1503 < 0 (-1 NOT_INSTALLED, -2 NOT_CONFIGURED, -3 COMMAND_ERROR): not applicable, never a finding; resolves NOT_READY
//	field 1523 (GPU recovery action)      sets the severity and action of the GPU's health findings (**)
//	health incidents                      see incidentRules below                                                                                   condition (***)
//
// (*) The counter name is the total field's DCGM name, for example
// DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL. A policy violation on a total and
// the rate condition of the same counter share a key, so they coalesce into
// one event: violations add occurrences, the rate check raises and resolves.
// (**) GPU_RESET and DRAIN_AND_RESET make a finding Fatal/ResetGPU (gpuhealth
// always drains before a reset), NODE_REBOOT Fatal/RebootNode; NONE and
// DRAIN_P2P change nothing. It applies to incidents on a GPU or a GPU's link
// and to XID 154, and never replaces ContactSupport or ReplaceNode: a reset
// does not remove the need for a person.
// (***) DCGM's health check reports what it found since the previous check,
// so an incident missing from the next check resolves. Incidents DCGM derives
// from XIDs (its message says "triggered by XID n", and codes 81, 120 and
// 131) stay in every check until the host engine restarts, so they are
// reported once, not repeated, and resolve when DCGM drops them.
// A GPU DCGM lists without a UUID is named by its PCI bus id, and without
// either by "dcgm-gpu-<id>"; an NVSwitch by "nvswitch-<DCGM id>", since
// DCGM's incidents do not carry the switch's PCI bus id.

// Finding codes that are not DCGM names.
const (
	codeIMEXDaemonNotReady = "NOT_READY"
)

// IMEX component ids.
const (
	imexDomainID = "domain"
	imexDaemonID = "daemon"
)

// dcgmPriority is DCGM's own verdict on an error code (dcgmErrorSeverity_t),
// as its table dcgmErrorMeta gives it (dcgmlib/src/dcgm_errors.c).
type dcgmPriority string

// DCGM's priorities.
const (
	// priorityMonitor: DCGM_ERROR_MONITOR, the GPU can work but is watched.
	priorityMonitor dcgmPriority = "MONITOR"
	// priorityIsolate: DCGM_ERROR_ISOLATE, the GPU cannot work; isolate it.
	priorityIsolate dcgmPriority = "ISOLATE"
	// priorityTriage: DCGM_ERROR_TRIAGE, to be triaged.
	priorityTriage dcgmPriority = "TRIAGE"
	// priorityConfig: DCGM_ERROR_CONFIG, a configuration matter.
	priorityConfig dcgmPriority = "CONFIG"
	// priorityReset: DCGM_ERROR_RESET, drain and reset the GPU.
	priorityReset dcgmPriority = "RESET"
)

// outcome is a severity and an action.
type outcome struct {
	severity gpuhealthv1alpha1.Severity
	action   gpuhealthv1alpha1.Action
}

// placement is how an incident's component is found.
type placement int

const (
	// placeEntity: the incident's entity (a GPU, an NVSwitch or a link).
	placeEntity placement = iota
	// placeLink: the link DCGM's message names ("link 3", "port 3") on the
	// GPU or NVSwitch entity; the entity itself when the message names none.
	placeLink
	// placeSwitch: the NVSwitch, also when DCGM names one of its links.
	placeSwitch
	// placeIMEX: the IMEX domain or daemon DCGM's message names; the daemon
	// when it names neither.
	placeIMEX
	// placeFabricHealth: DCGM_FR_FIELD_VIOLATION is reported only when it is
	// about the GPU's fabric health mask ("Fabric Health: ..."); the code is
	// DCGM's generic one for a field that should be 0.
	placeFabricHealth
)

// incidentRule is how one health code maps. A rule without a check is a code
// the source does not report.
type incidentRule struct {
	// name is DCGM's name of the code.
	name string
	// priority is DCGM's own priority for the code.
	priority dcgmPriority
	// check is the finding's check; empty: not reported (logged at V(1)).
	check gpuhealthv1alpha1.Check
	// outcome is the finding's severity and action.
	outcome
	// warn, when set, is the outcome when DCGM grades the incident only a
	// warning (HealthWarn).
	warn *outcome
	// place is how the component is found.
	place placement
	// xidOnly says DCGM reports the code only from an XID it saw, so the
	// incident stays until the host engine restarts.
	xidOnly bool
	// why is the reason for the row.
	why string
}

// Outcomes the table uses.
var (
	fatalReset     = outcome{gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionResetGPU}
	fatalReboot    = outcome{gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode}
	fatalSupport   = outcome{gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport}
	fatalRecertify = outcome{gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRecertify}
	degRecertify   = outcome{gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify}
	degReset       = outcome{gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionResetGPU}
	degSupport     = outcome{gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionContactSupport}
	degNone        = outcome{gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionNone}
)

// Checks the table uses, shortened.
const (
	checkECC          = gpuhealthv1alpha1.CheckECC
	checkGPULost      = gpuhealthv1alpha1.CheckGPULost
	checkNVLinkErrors = gpuhealthv1alpha1.CheckNVLinkErrors
	checkNVLinkDown   = gpuhealthv1alpha1.CheckNVLinkDown
	checkNVSwitch     = gpuhealthv1alpha1.CheckNVSwitch
	checkSXID         = gpuhealthv1alpha1.CheckSXID
	checkFabric       = gpuhealthv1alpha1.CheckFabric
	checkIMEXDaemon   = gpuhealthv1alpha1.CheckIMEXDaemon
	checkPCIe         = gpuhealthv1alpha1.CheckPCIe
	checkInfoROM      = gpuhealthv1alpha1.CheckInfoROM
	checkThermal      = gpuhealthv1alpha1.CheckThermal
	checkPower        = gpuhealthv1alpha1.CheckPower
)

// incidentRules is every DCGM health error code a health check of the
// enabled watches can carry, by DCGM's number (dcgmError_t in dcgm_errors.h,
// DCGM 4.6), with what gpuhealth makes of it. The finding's code is DCGM's
// name (SXID findings: the SXid number). DCGM's priority is its
// dcgmErrorMeta entry; where gpuhealth's severity or action reads
// differently, why says so. Codes not listed (DCGM's diagnostic codes, and
// the driver and ConnectX watches, which are not enabled) are ignored and
// logged at V(1).
var incidentRules = map[HealthCode]incidentRule{
	// Memory (MEM watch, and XIDs DCGM always watches).
	4: {name: "DCGM_FR_VOLATILE_DBE_DETECTED", priority: priorityIsolate, check: checkECC, outcome: fatalReset,
		why: "an uncorrectable (double-bit) ECC error; DCGM: drain the GPU and reset it or reboot, as NVIDIA's XID catalog says for XID 48"},
	5: {name: "DCGM_FR_VOLATILE_SBE_DETECTED", priority: priorityMonitor, check: checkECC, outcome: degRecertify,
		why: "corrected (single-bit) errors over DCGM's limit; the GPU still works, so it is observed"},
	6: {name: "DCGM_FR_PENDING_PAGE_RETIREMENTS", priority: priorityReset, check: checkECC, outcome: degReset,
		why: "a page waits to be retired at the next GPU reset; DCGM's table says RESET, but its health watch grades it a warning and advises monitoring, and NVIDIA's XID catalog ignores XID 63 (from which DCGM also raises it), so it is Degraded with the reset as its action"},
	7: {name: "DCGM_FR_RETIRED_PAGES_LIMIT", priority: priorityIsolate, check: checkECC, outcome: fatalSupport,
		why: "the GPU retired DCGM's limit of pages (60): worn memory that a field diagnostic, not a reset, settles"},
	8: {name: "DCGM_FR_RETIRED_PAGES_DBE_LIMIT", priority: priorityIsolate, check: checkECC, outcome: fatalSupport,
		why: "pages keep being retired for double-bit errors past DCGM's soft limit: worn memory; DCGM asks for a field diagnostic"},
	52: {name: "DCGM_FR_FAULTY_MEMORY", priority: priorityIsolate, check: checkECC, outcome: fatalSupport,
		why: "DCGM reports the GPU's memory unrepairable (field 1507); DCGM asks for a field diagnostic"},
	80: {name: "DCGM_FR_ROW_REMAP_FAILURE", priority: priorityReset, check: checkECC, outcome: fatalReset,
		why: "row remapping failed after uncorrectable errors (also from XID 64); DCGM: reset the GPU or reboot immediately, as the XID catalog says for XID 64"},
	81: {name: "DCGM_FR_UNCONTAINED_ERROR", priority: priorityIsolate, check: checkECC, outcome: fatalReset, xidOnly: true,
		why: "an uncontained ECC error (XID 95); DCGM: drain and reset or reboot, as the XID catalog says for XID 95"},
	83: {name: "DCGM_FR_DBE_PENDING_PAGE_RETIREMENTS", priority: priorityReset, check: checkECC, outcome: fatalReset,
		why: "a page retirement waits after a double-bit error; DCGM: drain the GPU and reset it"},
	84: {name: "DCGM_FR_UNCORRECTABLE_ROW_REMAP", priority: priorityReset, check: checkECC, outcome: fatalReset,
		why: "rows were remapped for uncorrectable errors; the remap takes effect at the next reset (DCGM: RESET)"},
	85: {name: "DCGM_FR_PENDING_ROW_REMAP", priority: priorityReset, check: checkECC, outcome: fatalReset,
		why: "a row remap waits for a GPU reset; until then the faulty row is in use (DCGM: RESET)"},
	131: {name: "DCGM_FR_CONTAINED_ERROR", priority: priorityMonitor, check: checkECC, outcome: degReset, xidOnly: true,
		why: "a contained ECC error (XID 94) killed one application; NVIDIA: reset the GPU when convenient, so Degraded with a reset as the action (the XID event itself stays Info as the catalog says)"},
	132: {name: "DCGM_FR_UNCORRECTABLE_ROW_REMAP_LIMIT", priority: priorityTriage, check: checkECC, outcome: degSupport,
		why: "the GPU passed DCGM's limit of rows remapped for uncorrectable errors; DCGM grades it a warning and asks for a field diagnostic"},
	// InfoROM (INFOROM watch).
	9: {name: "DCGM_FR_CORRUPT_INFOROM", priority: priorityTriage, check: checkInfoROM, outcome: degSupport,
		why: "the InfoROM, which keeps the GPU's ECC and retired-page records, is corrupt; DCGM: flash it, which needs a person"},
	// PCIe (PCIE watch).
	3: {name: "DCGM_FR_PCI_REPLAY_RATE", priority: priorityIsolate, check: checkPCIe, outcome: degRecertify,
		why: "PCIe replays over DCGM's limit (8 a minute): a link error counter rising too fast, judged like the NVLink ones; DCGM grades it a warning, so Degraded"},
	// Thermal and power (THERMAL and POWER watches): DCGM only monitors
	// them, so they are Degraded with no action: visible (a slow GPU holds
	// back every rank of a collective), acted on only by a policy rule.
	10: {name: "DCGM_FR_CLOCKS_EVENT_THERMAL", priority: priorityMonitor, check: checkThermal, outcome: degNone,
		why: "clocks slowed for heat: a performance event DCGM only monitors"},
	11: {name: "DCGM_FR_POWER_UNREADABLE", priority: priorityMonitor, check: checkPower, outcome: degNone,
		why: "the power reading failed: telemetry DCGM only monitors, and power capping cannot work without it"},
	12: {name: "DCGM_FR_CLOCKS_EVENT_POWER", priority: priorityMonitor,
		why: "not reported: clocks slowed to meet the power limit is normal under load; DCGM only monitors it"},
	40: {name: "DCGM_FR_THERMAL_VIOLATIONS", priority: priorityMonitor, check: checkThermal, outcome: degNone,
		why: "thermal violations (DCGM before 4.6 raises it from XID 62): a performance event DCGM only monitors; the XID event reports XID 62 itself"},
	41: {name: "DCGM_FR_THERMAL_VIOLATIONS_TS", priority: priorityMonitor, check: checkThermal, outcome: degNone,
		why: "as DCGM_FR_THERMAL_VIOLATIONS"},
	42: {name: "DCGM_FR_TEMP_VIOLATION", priority: priorityMonitor, check: checkThermal, outcome: degNone,
		why: "a temperature over a user-set maximum: DCGM only monitors it"},
	43: {name: "DCGM_FR_CLOCKS_EVENT_VIOLATION", priority: priorityMonitor, check: checkThermal, outcome: degNone,
		why: "a non-benign clocks event (hardware slowdown, thermal or power brake): DCGM only monitors it"},
	// NVLink (NVLINK watch).
	13: {name: "DCGM_FR_NVLINK_ERROR_THRESHOLD", priority: priorityIsolate, check: checkNVLinkErrors, outcome: degRecertify,
		why: "NVLink CRC errors over DCGM's count but under 100/s; DCGM grades it a warning and says the link can still work"},
	14: {name: "DCGM_FR_NVLINK_DOWN", priority: priorityTriage, check: checkNVLinkDown, outcome: degRecertify, place: placeLink,
		why: "a GPU or NVSwitch link is down: the GPU works at reduced NVLink bandwidth"},
	70: {name: "DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD", priority: priorityIsolate, check: checkNVLinkErrors, outcome: degRecertify,
		why: "NVLink CRC errors over 100/s: a marginal link, judged like the source's own NVLink rates (Degraded; a policy quarantines it after a debounce)"},
	71: {name: "DCGM_FR_NVLINK_ERROR_CRITICAL", priority: priorityIsolate, check: checkNVLinkErrors, outcome: fatalReset, warn: &degRecertify,
		why: "an NVLink counter that should stay 0 (replay, recovery, malformed or dropped packets) moved; a reset retrains the links. When DCGM only warns (successful link recoveries) it is Degraded"},
	119: {name: "DCGM_FR_NVLINK_EFFECTIVE_BER_THRESHOLD", priority: priorityIsolate, check: checkNVLinkErrors, outcome: degRecertify,
		why: "the NVLink effective bit error rate is over DCGM's threshold: a marginal link, like the CRC rate"},
	121: {name: "DCGM_FR_NVLINK_SYMBOL_BER_THRESHOLD", priority: priorityIsolate, check: checkNVLinkErrors, outcome: fatalReset,
		why: "NVLink symbol errors that FEC did not correct: like a counter that should stay 0"},
	99: {name: "DCGM_FR_GPU_EXPECTED_NVLINKS_UP", priority: priorityTriage, check: checkNVLinkDown, outcome: degRecertify, place: placeLink,
		why: "fewer GPU NVLinks up than expected"},
	100: {name: "DCGM_FR_NVSWITCH_EXPECTED_NVLINKS_UP", priority: priorityTriage, check: checkNVLinkDown, outcome: degRecertify, place: placeLink,
		why: "fewer NVSwitch NVLinks up than expected"},
	33: {name: "DCGM_FR_FIELD_VIOLATION", priority: priorityIsolate, check: checkFabric, outcome: fatalRecertify, place: placeFabricHealth,
		why: "the GPU's fabric health mask reports an unhealthy route, a route or access-timeout recovery or a wrong configuration (Fatal, as the NVML source judges an unhealthy fabric); \"Bandwidth Degraded\" is Degraded, like LIMITED_CAPACITY. Other uses of this generic code are not reported"},
	123: {name: "DCGM_FR_FABRIC_PROBE_STATE", priority: priorityMonitor, check: checkFabric, outcome: fatalRecertify, warn: &degRecertify,
		why: "Fabric Manager has not trained the GPU's fabric (not started, failed): the GPU cannot use NVLink, Fatal like the NVML source's fabric state; while training is in progress DCGM only warns, Degraded"},
	112: {name: "DCGM_FR_FABRIC_MANAGER_TRAINING_ERROR", priority: priorityConfig, check: checkFabric, outcome: fatalRecertify,
		why: "Fabric Manager did not finish training the NVLink fabric"},
	// NVSwitch (NVSWITCH_FATAL and NVSWITCH_NONFATAL watches).
	15: {name: "DCGM_FR_NVSWITCH_FATAL_ERROR", priority: priorityIsolate, check: checkNVSwitch, outcome: fatalReboot, place: placeSwitch,
		why: "a fatal NVSwitch error: the switch and its GPUs need a reset, which on NVSwitch systems is a reboot, as for a fatal SXid"},
	16: {name: "DCGM_FR_NVSWITCH_NON_FATAL_ERROR", priority: priorityMonitor, check: checkNVSwitch, outcome: degRecertify, place: placeSwitch,
		why: "a non-fatal NVSwitch error; DCGM: monitor the switch"},
	17: {name: "DCGM_FR_NVSWITCH_DOWN", priority: priorityMonitor, check: checkNVLinkDown, outcome: degRecertify, place: placeLink,
		why: "an NVSwitch port is down (DCGM marks the code deprecated): like a link that is down"},
	88: {name: "DCGM_FR_NVSWITCH_NVLINK_DOWN", priority: priorityIsolate, check: checkNVLinkDown, outcome: degRecertify, place: placeLink,
		why: "an NVSwitch link is down (deprecated): like a link that is down"},
	109: {name: "DCGM_FR_SXID_ERROR", priority: priorityIsolate, check: checkSXID, outcome: fatalReboot, place: placeSwitch,
		why: "a fatal NVSwitch SXid, coded by its number as the kernel-log source reports it"},
	// The GPU (XIDs DCGM always watches).
	120: {name: "DCGM_FR_FALLEN_OFF_BUS", priority: priorityIsolate, check: checkGPULost, outcome: fatalReboot, xidOnly: true,
		why: "the GPU fell off the bus (XID 79): only a reboot brings it back, as the XID catalog says"},
	101: {name: "DCGM_FR_XID_ERROR", priority: priorityTriage,
		why: "not reported: the XID policy violation reports every XID with its number, classified by the XID catalog"},
	// IMEX (IMEX watch; NVLINK watch before DCGM had it).
	122: {name: "DCGM_FR_IMEX_UNHEALTHY", priority: priorityIsolate, check: checkIMEXDaemon, outcome: degRecertify, place: placeIMEX,
		why: "the IMEX daemon is not READY (Degraded, like field 1503) or the domain is DOWN (Fatal) or DEGRADED (Degraded), like field 1502; a daemon status below 0 is not applicable. The operator judges IMEX only on ComputeDomain members"},
}

var (
	// linkInMessage finds the link in DCGM's link messages: "GPU %u's
	// NvLink link %d is currently down", "NVSwitch %u's NvLink %u is down",
	// "NvSwitch physical ID %u's NvLink port %d is currently down".
	linkInMessage = regexp.MustCompile(`(?:[Ll]ink|port) (\d+)`)
	// sxidInMessage finds the SXid in DCGM_FR_SXID_ERROR_MSG,
	// "Detected fatal NvSwitch SXID %u".
	sxidInMessage = regexp.MustCompile(`SXID (\d+)`)
	// imexInMessage finds what DCGM_FR_IMEX_UNHEALTHY_MSG, "IMEX %s status
	// is %s (%s)", is about: "domain" or "daemon", and its status.
	imexInMessage = regexp.MustCompile(`IMEX (domain|daemon) status is (\S+)`)
	// xidInMessage finds the XID DCGM derived an incident from: it appends
	// " (triggered by XID %u: ...)" to the message.
	xidInMessage = regexp.MustCompile(`triggered by XID (\d+)`)
)

// gpuIDs maps DCGM GPU ids to component ids.
type gpuIDs map[uint]string

// newGPUIDs indexes the GPUs DCGM listed.
func newGPUIDs(gpus []GPU) gpuIDs {
	m := gpuIDs{}
	for _, g := range gpus {
		switch {
		case g.UUID != "":
			m[g.ID] = g.UUID
		case g.PCIBusID != "":
			m[g.ID] = g.PCIBusID
		}
	}
	return m
}

// component returns the component id of DCGM GPU id.
func (m gpuIDs) component(gpu uint) string {
	if id, ok := m[gpu]; ok {
		return id
	}
	return fmt.Sprintf("dcgm-gpu-%d", gpu)
}

// gpuComponent is the GPU component of DCGM GPU id.
func (m gpuIDs) gpuComponent(gpu uint) gpuhealthv1alpha1.Component {
	return gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: m.component(gpu)}
}

// linkComponent is the NVLink component of a GPU's link.
func (m gpuIDs) linkComponent(gpu uint, link uint) gpuhealthv1alpha1.Component {
	return gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVLink, ID: fmt.Sprintf("%s/link-%d", m.component(gpu), link)}
}

// switchID is the component id of DCGM switch id.
func switchID(id uint) string {
	return fmt.Sprintf("nvswitch-%d", id)
}

// violationToFinding maps a policy violation; false for a kind the source
// does not report.
func violationToFinding(v Violation, gpus gpuIDs) (monitors.Finding, bool) {
	f := monitors.Finding{Source: gpuhealthv1alpha1.SourceDCGM, Time: v.Time}
	switch v.Kind {
	case ViolationXID:
		f.Check = gpuhealthv1alpha1.CheckXID
		f.Component = gpus.gpuComponent(v.GPU)
		f.Code = strconv.FormatUint(uint64(v.XID), 10)
		f.Message = fmt.Sprintf("DCGM XID policy violation: XID %d on GPU %d", v.XID, v.GPU)
		return f, true
	case ViolationNVLink:
		f.Check = gpuhealthv1alpha1.CheckNVLinkErrors
		f.Severity = gpuhealthv1alpha1.SeverityDegraded
		f.Action = gpuhealthv1alpha1.ActionRecertify
		if lane, ok := perLinkFields[v.Field]; ok {
			f.Component = gpus.linkComponent(v.GPU, uint(lane.link))
			f.Code = lane.total.String()
			f.Message = fmt.Sprintf("DCGM NVLink policy violation: %s is %d on GPU %d link %d", v.Field, v.Counter, v.GPU, lane.link)
			return f, true
		}
		f.Component = gpus.gpuComponent(v.GPU)
		f.Code = v.Field.String()
		f.Message = fmt.Sprintf("DCGM NVLink policy violation: %s is %d on GPU %d", v.Field, v.Counter, v.GPU)
		return f, true
	default:
		return monitors.Finding{}, false
	}
}

// incidentToFinding maps a health incident; false for a code the source
// does not report.
func incidentToFinding(in Incident, gpus gpuIDs) (monitors.Finding, bool) {
	rule, ok := incidentRules[in.Code]
	if !ok || rule.check == "" {
		return monitors.Finding{}, false
	}
	out := rule.outcome
	if rule.warn != nil && in.Health == HealthWarn {
		out = *rule.warn
	}
	f := monitors.Finding{
		Source:    gpuhealthv1alpha1.SourceDCGM,
		Check:     rule.check,
		Component: entityComponent(in.Entity, gpus),
		Code:      rule.name,
		Severity:  out.severity,
		Action:    out.action,
		Message:   fmt.Sprintf("DCGM health check: %s [%s, DCGM priority %s]", in.Message, rule.name, rule.priority),
	}
	switch rule.place {
	case placeEntity:
	case placeLink:
		if in.Entity.Kind == EntityGPU || in.Entity.Kind == EntitySwitch {
			if m := linkInMessage.FindStringSubmatch(in.Message); m != nil {
				if link, err := strconv.ParseUint(m[1], 10, 16); err == nil {
					f.Component = linkOf(in.Entity.Kind, in.Entity.ID, uint(link), gpus)
				}
			}
		}
	case placeSwitch:
		if in.Entity.Kind == EntityLink && in.Entity.Parent == EntitySwitch {
			f.Component = gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVSwitch, ID: switchID(in.Entity.ID)}
		}
	case placeIMEX:
		f.Component = gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentIMEX, ID: imexDaemonID}
		if m := imexInMessage.FindStringSubmatch(in.Message); m != nil {
			if !imexIncident(&f, m[1], strings.TrimSuffix(m[2], ",")) {
				return monitors.Finding{}, false
			}
		}
	case placeFabricHealth:
		if !strings.Contains(in.Message, "Fabric Health") {
			return monitors.Finding{}, false
		}
		if strings.Contains(in.Message, "Bandwidth Degraded") {
			f.Severity, f.Action = degRecertify.severity, degRecertify.action
		}
	}
	if in.Code == HealthSXIDError {
		// CheckSXID's code is the SXid number, as from the kernel log.
		if m := sxidInMessage.FindStringSubmatch(in.Message); m != nil {
			f.Code = m[1]
		}
	}
	return f, true
}

// imexIncident places a DCGM_FR_IMEX_UNHEALTHY finding on the domain or the
// daemon DCGM's message names, with the severity the IMEX fields would get;
// false when the status says IMEX does not apply to this node.
func imexIncident(f *monitors.Finding, what, status string) bool {
	if what == "daemon" {
		if n, err := strconv.ParseInt(status, 10, 64); err == nil && n < 0 {
			return false // -1 not installed, -2 not configured, -3 command error
		}
		return true
	}
	f.Check = gpuhealthv1alpha1.CheckIMEXDomain
	f.Component.ID = imexDomainID
	switch status {
	case imexDomainNotInstalled, imexDomainNotConfigured, imexDomainUnavailable:
		return false
	case imexDomainDown:
		f.Severity = gpuhealthv1alpha1.SeverityFatal
	default:
		f.Severity = gpuhealthv1alpha1.SeverityDegraded
	}
	return true
}

// fromXIDHistory says whether DCGM derived the incident from an XID it saw.
// DCGM never forgets those while the host engine runs, so the incident is in
// every later check.
func fromXIDHistory(in Incident) bool {
	if rule, ok := incidentRules[in.Code]; ok && rule.xidOnly {
		return true
	}
	return xidInMessage.MatchString(in.Message)
}

// incidentGPU is the DCGM id of the GPU an incident is about: a GPU or a
// GPU's link; false for anything else.
func incidentGPU(in Incident) (uint, bool) {
	switch {
	case in.Entity.Kind == EntityGPU:
		return in.Entity.ID, true
	case in.Entity.Kind == EntityLink && in.Entity.Parent == EntityGPU:
		return in.Entity.ID, true
	}
	return 0, false
}

// applyRecovery honours the GPU recovery action DCGM reports for the
// finding's GPU: a reset or a drain-and-reset makes it Fatal with ResetGPU
// (gpuhealth drains before any reset), a reboot Fatal with RebootNode. NONE
// and DRAIN_P2P change nothing, and neither does any action when the
// finding already asks for a person (ContactSupport, ReplaceNode).
func applyRecovery(f *monitors.Finding, a recoveryAction) {
	var action gpuhealthv1alpha1.Action
	switch a {
	case recoveryReset, recoveryDrainAndReset:
		action = gpuhealthv1alpha1.ActionResetGPU
	case recoveryReboot:
		action = gpuhealthv1alpha1.ActionRebootNode
	default:
		return
	}
	if f.Action == gpuhealthv1alpha1.ActionContactSupport || f.Action == gpuhealthv1alpha1.ActionReplaceNode {
		return
	}
	f.Severity, f.Action = gpuhealthv1alpha1.SeverityFatal, action
	f.Message += fmt.Sprintf("; %s is %d (%s)", FieldGPURecoveryAction, int64(a), recoveryActionNames[a])
}

// linkOf is the NVLink component of a GPU's or an NVSwitch's link.
func linkOf(kind EntityKind, id, link uint, gpus gpuIDs) gpuhealthv1alpha1.Component {
	if kind == EntitySwitch {
		return gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVLink, ID: fmt.Sprintf("%s/link-%d", switchID(id), link)}
	}
	return gpus.linkComponent(id, link)
}

// entityComponent is the component an incident's entity names.
func entityComponent(e Entity, gpus gpuIDs) gpuhealthv1alpha1.Component {
	switch e.Kind {
	case EntityGPU:
		return gpus.gpuComponent(e.ID)
	case EntitySwitch:
		return gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVSwitch, ID: switchID(e.ID)}
	case EntityLink:
		if e.Parent == EntityGPU || e.Parent == EntitySwitch {
			return linkOf(e.Parent, e.ID, e.Link, gpus)
		}
	}
	return gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNode}
}
