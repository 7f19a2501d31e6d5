package kmsg

import (
	"testing"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// TestSXidTable checks one code of each class NVIDIA's Fabric Manager User
// Guide lists (appendix "NVSwitch SXid errors"), and the fallback by flag.
func TestSXidTable(t *testing.T) {
	F, D, I := gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.SeverityInfo
	reboot, recert, none := gpuhealthv1alpha1.ActionRebootNode, gpuhealthv1alpha1.ActionRecertify, gpuhealthv1alpha1.ActionNone
	cases := []struct {
		code     int
		flag     string
		severity gpuhealthv1alpha1.Severity
		action   gpuhealthv1alpha1.Action
	}{
		{11012, "Non-fatal", I, none},   // NPORT_INGRESS_NCISOC_HDR_ECC_LIMIT_ERR: single-bit, corrected
		{24003, "Non-fatal", I, none},   // SOURCETRACK ECC limit
		{20001, "Non-fatal", I, none},   // DLPL_TX_REPLAY
		{22013, "Non-fatal", I, none},   // MINION_NONFATAL
		{20012, "Non-fatal", D, recert}, // DLPL_RX_CRC_COUNTER: check the link
		{12028, "Non-fatal", D, recert}, // EGRESS_PRIVRSPERR: stalls, XID 45
		{11004, "Non-fatal", D, recert}, // INGRESS_ACLFAIL
		{19084, "Non-fatal", F, reboot}, // AN1 heartbeat timeout: reset GPUs and switches
		{20034, "Fatal", F, reboot},     // DLPL_LTSSM_FAULT_UP
		{24007, "Fatal", F, reboot},     // SOURCETRACK_TIME_OUT_ERR
		{12020, "Fatal", F, reboot},     // EGRESS_SEQIDERR: always fatal
		{23009, "Fatal", F, reboot},     // NXBAR tile: always fatal
		{10001, "Non-fatal", D, none},   // HOST_PRIV_ERROR: monitor
		{10004, "", D, none},            // HOST_THERMAL_EVENT_START
		{26006, "", F, reboot},          // SOE_HALT
		{12028, "Correctable", I, none}, // the driver corrected it
		{28006, "Non-fatal", D, none},   // renumbered in 550: by flag
		{28006, "Fatal", F, reboot},
		{30000, "", D, none},
	}
	for _, tc := range cases {
		s, a, why := judgeSXid(Entry{Code: tc.code, Flag: tc.flag})
		if s != tc.severity || a != tc.action || why == "" {
			t.Errorf("SXid %d %q = %s/%s (%s); want %s/%s", tc.code, tc.flag, s, a, why, tc.severity, tc.action)
		}
	}
}
