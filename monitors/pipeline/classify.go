package pipeline

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/api/xid"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// checkDefaults is the default severity and action of the checks other than
// XID, when the source left them empty. The operator's RemediationPolicy
// rules may judge any finding differently; these only fill the event's spec.
var checkDefaults = map[gpuhealthv1alpha1.Check]struct {
	severity gpuhealthv1alpha1.Severity
	action   gpuhealthv1alpha1.Action
}{
	gpuhealthv1alpha1.CheckGPULost:      {gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode},
	gpuhealthv1alpha1.CheckSXID:         {gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode},
	gpuhealthv1alpha1.CheckFabric:       {gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRecertify},
	gpuhealthv1alpha1.CheckIMEXDomain:   {gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRecertify},
	gpuhealthv1alpha1.CheckIMEXDaemon:   {gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify},
	gpuhealthv1alpha1.CheckNVLinkErrors: {gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify},
	gpuhealthv1alpha1.CheckNVLinkDown:   {gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify},
	gpuhealthv1alpha1.CheckNVSwitch:     {gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRecertify},
	gpuhealthv1alpha1.CheckECC:          {gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify},
	gpuhealthv1alpha1.CheckPCIe:         {gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify},
	gpuhealthv1alpha1.CheckInfoROM:      {gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionContactSupport},
	gpuhealthv1alpha1.CheckThermal:      {gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionNone},
	gpuhealthv1alpha1.CheckPower:        {gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionNone},
	// The slow-GPU checks (docs/monitors.md): the NVML source sets severity
	// and action per code; these are the defaults for other producers.
	gpuhealthv1alpha1.CheckThrottled:      {gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify},
	gpuhealthv1alpha1.CheckPCIeDegraded:   {gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify},
	gpuhealthv1alpha1.CheckMemoryRepair:   {gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionResetGPU},
	gpuhealthv1alpha1.CheckThermalMargin:  {gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone},
	gpuhealthv1alpha1.CheckNVLinkDegraded: {gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify},
}

// maxMessage bounds the message copied into the event's spec.
const maxMessage = 1024

// classify fills a finding's severity and action where the source left them
// empty: XIDs from the versioned catalog in api/xid (recent are the other
// XIDs reported on the same GPU moments before, which NVIDIA's workflows for
// XID 45, 48 and 159 consult), other checks from checkDefaults. It also
// applies the catalog's rule that a GPU reset needs the GPU's identity: a
// ResetGPU finding without a component id asks for a node reboot instead.
func classify(f *monitors.Finding, recent []int) {
	if f.Check == gpuhealthv1alpha1.CheckXID && (f.Severity == "" || f.Action == "") {
		n, err := strconv.Atoi(f.Code)
		if err != nil {
			n = 0 // Classify treats it as unknown: Fatal, ContactSupport
		}
		e := xid.Classify(n, f.Message, recent)
		if f.Severity == "" {
			f.Severity = e.Severity
		}
		if f.Action == "" {
			f.Action = e.Action
		}
		switch {
		case f.Message == "":
			f.Message = fmt.Sprintf("XID %d: %s; %s", n, e.Summary(), e.Reason)
		case !e.Known:
			f.Message = e.Description + ": " + f.Message
		case xid.JudgedPerOccurrence(n):
			// The verdict came from the line or from the XIDs before it:
			// say which, so that the event explains itself.
			f.Message += " [" + e.Reason + "]"
		}
	}
	if d, ok := checkDefaults[f.Check]; ok {
		if f.Severity == "" {
			f.Severity = d.severity
		}
		if f.Action == "" {
			f.Action = d.action
		}
	}
	if f.Severity == "" {
		f.Severity = gpuhealthv1alpha1.SeverityDegraded
	}
	if f.Action == "" {
		f.Action = gpuhealthv1alpha1.ActionRecertify
	}
	if f.Action == gpuhealthv1alpha1.ActionResetGPU && f.Component.ID == "" {
		f.Action = gpuhealthv1alpha1.ActionRebootNode
	}
}

// normalize makes a finding safe to turn into an object: a component kind,
// a bounded single-line message, and the checks the CRD would reject done
// here, so that a bad finding is counted and dropped instead of retried.
func normalize(f *monitors.Finding) error {
	if f.Source == "" || f.Check == "" {
		return fmt.Errorf("finding %s has no source or check", f.String())
	}
	if f.Code == "" {
		return fmt.Errorf("finding %s has no code", f.String())
	}
	if f.Component.Kind == "" {
		f.Component.Kind = gpuhealthv1alpha1.ComponentNode
	}
	if f.Check == gpuhealthv1alpha1.CheckXID {
		if n, err := strconv.Atoi(f.Code); err != nil || n < 0 || n > xid.MaxCode {
			return fmt.Errorf("finding %s: an XID code must be a number from 0 to %d", f.String(), xid.MaxCode)
		}
	}
	if f.Component.Kind == gpuhealthv1alpha1.ComponentGPU && f.Component.ID == "" {
		return fmt.Errorf("finding %s: a GPU component needs the GPU's UUID or PCI bus id", f.String())
	}
	msg := strings.Join(strings.Fields(strings.ToValidUTF8(f.Message, "?")), " ")
	if len(msg) > maxMessage {
		cut := maxMessage - 3
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "..."
	}
	f.Message = msg
	return nil
}
