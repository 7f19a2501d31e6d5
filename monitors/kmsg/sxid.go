package kmsg

import (
	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// The SXid table: what NVIDIA's Fabric Manager User Guide (DU-09883-001,
// appendix D, "NVSwitch SXid errors": non-fatal, fatal, always fatal and other
// notable SXids) says about each NVSwitch error, read into a severity and an
// action. The numbers and names are the driver's (NVSWITCH_ERR_HW_* in the
// open GPU kernel modules' ctrl_dev_nvswitch.h). An SXid not in the table is
// judged by the flag its line carries (sxidByFlag).
//
// A fatal SXid stops the switch's traffic on the port; NVIDIA's bare-metal
// recovery is to reset the GPUs (and, for a trunk port, all GPUs and
// switches, with Fabric Manager stopped), then reboot if that does not
// help: on one host that is RebootNode, and recertification proves the
// fabric. Codes 27000 and above changed meaning in driver 550 (OSFP thermal,
// multicast, reduction units), so they are judged by their flag only.
type sxidVerdict struct {
	severity gpuhealthv1alpha1.Severity
	action   gpuhealthv1alpha1.Action
	why      string
}

var (
	sxidCorrected = sxidVerdict{gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone,
		"single-bit ECC the hardware corrected; NVIDIA: no action"}
	sxidNonFatalInfo = sxidVerdict{gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone,
		"non-fatal; NVIDIA: informational, Fabric Manager does not stop jobs"}
	sxidCheckLink = sxidVerdict{gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify,
		"non-fatal link errors; NVIDIA: check the link's mechanical connections"}
	sxidStall = sxidVerdict{gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify,
		"listed non-fatal, but NVIDIA says traffic through the port stalls and jobs abort with XID 45"}
	sxidFatal = sxidVerdict{gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode,
		"fatal; NVIDIA: reset the GPUs and switches on the port (on one host, a reboot)"}
	sxidAlwaysFatal = sxidVerdict{gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode,
		"always fatal to the whole fabric; NVIDIA: restart the host"}
	sxidMonitor = sxidVerdict{gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionNone,
		"NVIDIA: not fatal, but may be followed by fatal errors; recorded"}
	sxidThermal = sxidVerdict{gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionNone,
		"switch thermal event; NVIDIA: make sure the cooling is sufficient"}
	sxidSOE = sxidVerdict{gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode,
		"the switch's SOE micro-controller stopped; NVIDIA gives no recovery, and only a switch reset (on one host, a reboot) restarts it"}
)

// sxidTable is keyed by SXid number.
var sxidTable = func() map[int]sxidVerdict {
	t := map[int]sxidVerdict{}
	set := func(v sxidVerdict, codes ...int) {
		for _, c := range codes {
			t[c] = v
		}
	}
	span := func(first, last int) []int {
		var out []int
		for c := first; c <= last; c++ {
			out = append(out, c)
		}
		return out
	}
	// Non-fatal, single-bit ECC over its limit, corrected (D.4).
	set(sxidCorrected, 11012, 11021, 11022, 11023, 12021, 12023, 15008, 15011,
		19049, 19055, 19057, 19059, 19062, 19065, 19068, 19071, 24001, 24002, 24003)
	// Non-fatal, nothing to do (D.4): TX replay, MINION non-fatal.
	set(sxidNonFatalInfo, 20001, 22013)
	// Non-fatal: RX CRC counter, check the link (D.4).
	set(sxidCheckLink, 20012)
	// Listed non-fatal, but the port stalls (D.4): ACL failure, PRIV error.
	set(sxidStall, 11004, 12028)
	// Listed non-fatal, usually with a fatal one; reset GPUs and switches (D.4).
	set(sxidFatal, 19084)
	// Fatal (D.5).
	set(sxidFatal, 11001, 11009, 11013, 11018, 11019, 11020,
		12001, 12002, 12022, 12024, 12025, 12026, 12027, 12030, 12031, 12032,
		14017, 15001, 15006, 15009, 15010, 15012, 15013,
		19047, 19048, 19054, 19056, 19058, 19060, 19061, 19063, 19064, 19066, 19067, 19069, 19070,
		20034, 22012, 24004, 24005, 24006, 24007)
	// Always fatal (D.6).
	set(sxidAlwaysFatal, 12020, 22003, 22011)
	set(sxidAlwaysFatal, span(23001, 23017)...)
	// Other notable (D.7).
	set(sxidMonitor, 10001, 10002)
	set(sxidAlwaysFatal, 10003)
	set(sxidThermal, 10004, 10005)
	// SOE halted, external error, watchdog.
	set(sxidSOE, 26006, 26007, 26008)
	return t
}()

// judgeSXid returns the severity and action for an SXid line, and why.
func judgeSXid(e Entry) (gpuhealthv1alpha1.Severity, gpuhealthv1alpha1.Action, string) {
	if e.Flag == "Correctable" {
		return gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone, "correctable; the driver corrected it"
	}
	if v, ok := sxidTable[e.Code]; ok {
		return v.severity, v.action, v.why
	}
	switch e.Flag {
	case "Fatal":
		return sxidFatal.severity, sxidFatal.action, "the line says Fatal; " + sxidFatal.why
	case "Non-fatal":
		return gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionNone, "the line says Non-fatal: the hardware contained it; recorded so that a rate is visible"
	}
	return gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionNone, "an SXid without a severity NVIDIA documents: recorded"
}
