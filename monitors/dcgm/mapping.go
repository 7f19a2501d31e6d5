package dcgm

import (
	"fmt"
	"regexp"
	"strconv"

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
//	NVLink policy violation, link field   NVLinkErrors  NVLink <UUID>/link-<n>        total counter name (*)                 Degraded  Recertify  event
//	NVLink policy violation, total field  NVLinkErrors  GPU <UUID>                    counter name (*)                       Degraded  Recertify  event
//	fields 409/419/429/439 rate > limit   NVLinkErrors  GPU <UUID>                    counter name (*)                       Degraded  Recertify  condition: resolves when a full window is at or under the limit
//	field 1502 = DOWN                     IMEXDomain    IMEX domain                   DOWN                                   Fatal     Recertify  condition: resolves on UP or DEGRADED
//	field 1502 = DEGRADED                 IMEXDomain    IMEX domain                   DEGRADED                               Degraded  Recertify  condition: resolves on UP or DOWN
//	field 1503 != 5 (READY)               IMEXDaemon    IMEX daemon                   NOT_READY                              Degraded  Recertify  condition: resolves on READY
//	health 14 NVLINK_DOWN                 NVLinkDown    NVLink <UUID>/link-<n> (**)   DCGM_FR_NVLINK_DOWN                    Degraded  Recertify  condition (***)
//	health 70 NVLINK_CRC_ERROR_THRESHOLD  NVLinkErrors  GPU <UUID> or its link        DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD     Degraded  Recertify  condition (***)
//	health 71 NVLINK_ERROR_CRITICAL       NVLinkErrors  GPU <UUID> or its link        DCGM_FR_NVLINK_ERROR_CRITICAL          Fatal     ResetGPU   condition (***)
//	health 101 XID_ERROR                  ignored: the XID policy violation reports each XID with its number
//	health 109 SXID_ERROR                 SXID          NVSwitch nvswitch-<id>        SXid number, else DCGM_FR_SXID_ERROR   Fatal     RebootNode condition (***)
//	health 112 FABRIC_MANAGER_TRAINING    Fabric        GPU <UUID>, else Node         DCGM_FR_FABRIC_MANAGER_TRAINING_ERROR  Fatal     Recertify  condition (***)
//	health 122 IMEX_UNHEALTHY             IMEXDaemon    IMEX daemon                   DCGM_FR_IMEX_UNHEALTHY                 Degraded  Recertify  condition (***)
//	other health codes                    ignored (logged at V(1)); only the NVLink, NVSwitch-fatal and IMEX watches are enabled
//
// (*) The counter name is the total field's DCGM name, for example
// DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL. A policy violation on a total and
// the rate condition of the same counter share a key, so they coalesce into
// one event: violations add occurrences, the rate check raises and resolves.
// (**) The link comes from the incident's link entity or, for a GPU entity,
// from DCGM's message ("GPU 0's NvLink link 3 is currently down"); without
// it the component is the GPU. (***) DCGM's health check reports what it
// found since the previous check, so an incident missing from the next check
// resolves. A GPU DCGM lists without a UUID is named by its PCI bus id, and
// without either by "dcgm-gpu-<id>"; an NVSwitch by "nvswitch-<DCGM id>",
// since DCGM's incidents do not carry the switch's PCI bus id.

// Finding codes that are not DCGM names.
const (
	codeIMEXDaemonNotReady = "NOT_READY"
)

// IMEX component ids.
const (
	imexDomainID = "domain"
	imexDaemonID = "daemon"
)

// incidentRule is how one health code maps.
type incidentRule struct {
	name     string
	check    gpuhealthv1alpha1.Check
	severity gpuhealthv1alpha1.Severity
	action   gpuhealthv1alpha1.Action
}

// incidentRules are the health codes the source reports; see the table above.
var incidentRules = map[HealthCode]incidentRule{
	HealthNVLinkDown:                 {"DCGM_FR_NVLINK_DOWN", gpuhealthv1alpha1.CheckNVLinkDown, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify},
	HealthNVLinkCRCErrorThreshold:    {"DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD", gpuhealthv1alpha1.CheckNVLinkErrors, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify},
	HealthNVLinkErrorCritical:        {"DCGM_FR_NVLINK_ERROR_CRITICAL", gpuhealthv1alpha1.CheckNVLinkErrors, gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionResetGPU},
	HealthSXIDError:                  {"DCGM_FR_SXID_ERROR", gpuhealthv1alpha1.CheckSXID, gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode},
	HealthFabricManagerTrainingError: {"DCGM_FR_FABRIC_MANAGER_TRAINING_ERROR", gpuhealthv1alpha1.CheckFabric, gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRecertify},
	HealthIMEXUnhealthy:              {"DCGM_FR_IMEX_UNHEALTHY", gpuhealthv1alpha1.CheckIMEXDaemon, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify},
}

var (
	// linkInMessage finds the link in DCGM_FR_NVLINK_DOWN_MSG,
	// "GPU %u's NvLink link %d is currently down".
	linkInMessage = regexp.MustCompile(`[Ll]ink (\d+)`)
	// sxidInMessage finds the SXid in DCGM_FR_SXID_ERROR_MSG,
	// "Detected fatal NvSwitch SXID %u".
	sxidInMessage = regexp.MustCompile(`SXID (\d+)`)
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
	if !ok {
		return monitors.Finding{}, false
	}
	f := monitors.Finding{
		Source:    gpuhealthv1alpha1.SourceDCGM,
		Check:     rule.check,
		Component: entityComponent(in.Entity, gpus),
		Code:      rule.name,
		Severity:  rule.severity,
		Action:    rule.action,
		Message:   fmt.Sprintf("DCGM health check: %s", in.Message),
	}
	switch in.Code {
	case HealthNVLinkDown:
		if in.Entity.Kind == EntityGPU {
			if m := linkInMessage.FindStringSubmatch(in.Message); m != nil {
				if link, err := strconv.ParseUint(m[1], 10, 16); err == nil {
					f.Component = gpus.linkComponent(in.Entity.ID, uint(link))
				}
			}
		}
	case HealthSXIDError:
		switch {
		case in.Entity.Kind == EntitySwitch:
		case in.Entity.Kind == EntityLink && in.Entity.Parent == EntitySwitch:
			f.Component = gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVSwitch, ID: switchID(in.Entity.ID)}
		}
		// CheckSXID's code is the SXid number, as from the kernel log.
		if m := sxidInMessage.FindStringSubmatch(in.Message); m != nil {
			f.Code = m[1]
		}
	case HealthIMEXUnhealthy:
		f.Component = gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentIMEX, ID: imexDaemonID}
	}
	return f, true
}

// entityComponent is the component an incident's entity names.
func entityComponent(e Entity, gpus gpuIDs) gpuhealthv1alpha1.Component {
	switch e.Kind {
	case EntityGPU:
		return gpus.gpuComponent(e.ID)
	case EntitySwitch:
		return gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVSwitch, ID: switchID(e.ID)}
	case EntityLink:
		if e.Parent == EntityGPU {
			return gpus.linkComponent(e.ID, e.Link)
		}
		if e.Parent == EntitySwitch {
			return gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVLink, ID: fmt.Sprintf("%s/link-%d", switchID(e.ID), e.Link)}
		}
	}
	return gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNode}
}
