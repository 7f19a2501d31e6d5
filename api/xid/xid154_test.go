package xid

import (
	"fmt"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// TestXID154ByValue reads XID 154 by the value the driver prints, on every
// wording: the table is NVIDIA's recovery-action enum as NVML publishes it
// (go-nvml's constants, which mirror the driver's), each value printed the
// way R610 drivers print it, the way earlier ones did, and with words
// gpuhealth has never seen. A line that carries words only still reads.
func TestXID154ByValue(t *testing.T) {
	F, I := gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.SeverityInfo
	type want struct {
		severity gpuhealthv1alpha1.Severity
		action   gpuhealthv1alpha1.Action
	}
	enum := []struct {
		value nvml.DeviceGpuRecoveryAction
		// words are what drivers print beside the value, newest first.
		words []string
		want  want
	}{
		{nvml.GPU_RECOVERY_ACTION_NONE, []string{"None"}, want{I, gpuhealthv1alpha1.ActionNone}},
		{nvml.GPU_RECOVERY_ACTION_GPU_RESET, []string{"PF FLR", "GPU Reset Required"}, want{F, gpuhealthv1alpha1.ActionResetGPU}},
		{nvml.GPU_RECOVERY_ACTION_NODE_REBOOT, []string{"OS Reboot", "Node Reboot Required"}, want{F, gpuhealthv1alpha1.ActionRebootNode}},
		{nvml.GPU_RECOVERY_ACTION_DRAIN_P2P, []string{"Drain P2P"}, want{F, gpuhealthv1alpha1.ActionRecertify}},
		{nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET, []string{"Drain and Reset"}, want{F, gpuhealthv1alpha1.ActionResetGPU}},
		{nvml.GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN, nil, want{F, gpuhealthv1alpha1.ActionContactSupport}},
		{nvml.GPU_RECOVERY_ACTION_BUS_RESET, nil, want{F, gpuhealthv1alpha1.ActionRebootNode}},
		{nvml.GPU_RECOVERY_ACTION_SYSTEM_REBOOT, nil, want{F, gpuhealthv1alpha1.ActionRebootNode}},
		// A value newer than this table: a person decides.
		{nvml.DeviceGpuRecoveryAction(0x1f), nil, want{F, gpuhealthv1alpha1.ActionContactSupport}},
	}
	check := func(t *testing.T, msg string, w want) {
		t.Helper()
		e := Classify(154, msg, nil)
		if e.Severity != w.severity || e.Action != w.action {
			t.Errorf("Classify(154, %q) = %s/%s (%s); want %s/%s", msg, e.Severity, e.Action, e.Reason, w.severity, w.action)
		}
	}
	for _, row := range enum {
		t.Run(fmt.Sprintf("0x%x", uint32(row.value)), func(t *testing.T) {
			for _, w := range append(row.words, "Words Nobody Printed Yet") {
				check(t, fmt.Sprintf("GPU recovery action changed from 0x0 (None) to 0x%x (%s)", uint32(row.value), w), row.want)
			}
			// The value decides when the words disagree with it.
			check(t, fmt.Sprintf("GPU recovery action changed from 0x0 (None) to 0x%x (Node Reboot Required)", uint32(row.value)), row.want)
			// A line with words only is read by its words.
			for _, w := range row.words {
				check(t, fmt.Sprintf("GPU recovery action changed from None to %s (%s)", w, w), row.want)
			}
		})
	}
	// Real R610 lines, whole.
	check(t, "GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)", want{F, gpuhealthv1alpha1.ActionRebootNode})
	check(t, "GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)", want{F, gpuhealthv1alpha1.ActionResetGPU})
	// Back to none, by value, whatever the earlier action was called.
	check(t, "GPU recovery action changed from 0x2 (OS Reboot) to 0x0 (None)", want{I, gpuhealthv1alpha1.ActionNone})
	// Neither a value nor words gpuhealth knows.
	check(t, "GPU recovery action changed", want{F, gpuhealthv1alpha1.ActionContactSupport})
}
