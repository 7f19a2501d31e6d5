package dcgm

import "fmt"

// Field is a DCGM field id (DCGM_FI_*). Only the fields this source reads
// have constants; String names any other by its number.
type Field uint16

// The DCGM fields this source watches. Numbers and names are from
// dcgm_fields.h as shipped with go-dcgm v1.4611.0; the NVLink totals were
// called DCGM_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL before, and DCGM keeps those
// names as deprecated aliases of the same ids.
const (
	// FieldNVLinkCRCFlitErrorTotal is the GPU's NVLink flow-control CRC error
	// count, summed over its links (cumulative).
	FieldNVLinkCRCFlitErrorTotal Field = 409
	// FieldNVLinkCRCDataErrorTotal is the GPU's NVLink data CRC error count,
	// summed over its links (cumulative).
	FieldNVLinkCRCDataErrorTotal Field = 419
	// FieldNVLinkReplayErrorTotal is the GPU's NVLink replay error count,
	// summed over its links (cumulative).
	FieldNVLinkReplayErrorTotal Field = 429
	// FieldNVLinkRecoveryErrorTotal is the GPU's NVLink recovery error count,
	// summed over its links (cumulative).
	FieldNVLinkRecoveryErrorTotal Field = 439
	// FieldIMEXDomainStatus is the node's IMEX domain status, a string: UP,
	// DOWN or DEGRADED (global field, not tied to a GPU).
	FieldIMEXDomainStatus Field = 1502
	// FieldIMEXDaemonStatus is the node's IMEX daemon status, a number from
	// 0 (INITIALIZING) to 7 (UNAVAILABLE); 5 is READY (global field). DCGM
	// also writes -1 (IMEX not installed), -2 (not configured) and -3
	// (nvidia-imex-ctl failed or timed out) when it has no daemon status.
	FieldIMEXDaemonStatus Field = 1503
	// FieldGPURecoveryAction is the action the driver says a GPU needs to
	// recover from a fault (NVML's nvmlDeviceGpuRecoveryAction_t): see the
	// recoveryAction constants.
	FieldGPURecoveryAction Field = 1523

	// The slow-GPU signals (monitors/slowgpu), the DCGM equivalents of what
	// the nvml source reads.

	// FieldSMClock is the SM clock in MHz.
	FieldSMClock Field = 100
	// FieldClocksEventReasons is the clocks event reasons bitmask
	// (DCGM_CLOCKS_EVENT_REASON_*, NVML's bits).
	FieldClocksEventReasons Field = 112
	// FieldMaxSMClock is the maximum SM clock in MHz.
	FieldMaxSMClock Field = 113
	// FieldGPUTemp is the GPU temperature in °C.
	FieldGPUTemp Field = 150
	// FieldSlowdownTemp is the GPU's slowdown temperature in °C.
	FieldSlowdownTemp Field = 158
	// FieldPCIeReplayCounter is the PCIe replay counter (cumulative).
	FieldPCIeReplayCounter Field = 202
	// FieldGPUUtil is the GPU utilisation in percent.
	FieldGPUUtil Field = 203
	// FieldPCIeMaxLinkGen, FieldPCIeMaxLinkWidth, FieldPCIeLinkGen and
	// FieldPCIeLinkWidth are the PCIe link at most and now.
	FieldPCIeMaxLinkGen   Field = 235
	FieldPCIeMaxLinkWidth Field = 236
	FieldPCIeLinkGen      Field = 237
	FieldPCIeLinkWidth    Field = 238
	// FieldPowerViolation, FieldThermalViolation and
	// FieldReliabilityViolation are the cumulative violation times in ns.
	FieldPowerViolation       Field = 240
	FieldThermalViolation     Field = 241
	FieldReliabilityViolation Field = 245
	// FieldECCDBEVolatileTotal is the volatile double-bit (uncorrected)
	// ECC count.
	FieldECCDBEVolatileTotal Field = 311
	// FieldRetiredPending is 1 while pages wait for retirement.
	FieldRetiredPending Field = 392
	// FieldRowRemapUncorrectable and FieldRowRemapCorrectable are the rows
	// remapped for uncorrectable and correctable errors.
	FieldRowRemapUncorrectable Field = 393
	FieldRowRemapCorrectable   Field = 394
	// FieldRowRemapFailed is 1 when a row remap failed; FieldRowRemapPending
	// is 1 while a remap waits for a GPU reset.
	FieldRowRemapFailed  Field = 395
	FieldRowRemapPending Field = 396
)

// perfFields are the slow-GPU signals read each poll.
var perfFields = []Field{
	FieldSMClock, FieldClocksEventReasons, FieldMaxSMClock, FieldGPUTemp, FieldSlowdownTemp,
	FieldPCIeReplayCounter, FieldGPUUtil, FieldPCIeMaxLinkGen, FieldPCIeMaxLinkWidth, FieldPCIeLinkGen,
	FieldPCIeLinkWidth, FieldPowerViolation, FieldThermalViolation, FieldReliabilityViolation,
	FieldECCDBEVolatileTotal, FieldRetiredPending, FieldRowRemapUncorrectable, FieldRowRemapCorrectable,
	FieldRowRemapFailed, FieldRowRemapPending,
}

// fieldNames are the DCGM names of the fields above; a finding's code uses them.
var fieldNames = map[Field]string{
	FieldNVLinkCRCFlitErrorTotal:  "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL",
	FieldNVLinkCRCDataErrorTotal:  "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL",
	FieldNVLinkReplayErrorTotal:   "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL",
	FieldNVLinkRecoveryErrorTotal: "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL",
	FieldIMEXDomainStatus:         "DCGM_FI_IMEX_DOMAIN_STATUS",
	FieldIMEXDaemonStatus:         "DCGM_FI_IMEX_DAEMON_STATUS",
	FieldGPURecoveryAction:        "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
}

// String returns the field's DCGM name, or DCGM_FI_<number> for a field this
// package has no name for. The result is a valid finding code.
func (f Field) String() string {
	if n, ok := fieldNames[f]; ok {
		return n
	}
	return fmt.Sprintf("DCGM_FI_%d", uint16(f))
}

// nvlinkTotals are the per-GPU NVLink totals this source judges as rates.
var nvlinkTotals = []Field{
	FieldNVLinkCRCFlitErrorTotal,
	FieldNVLinkCRCDataErrorTotal,
	FieldNVLinkReplayErrorTotal,
	FieldNVLinkRecoveryErrorTotal,
}

// gpuFields are the per-GPU fields the source watches and reads each poll:
// the NVLink totals, the GPU recovery action and the slow-GPU signals.
var gpuFields = append(append(append([]Field(nil), nvlinkTotals...), FieldGPURecoveryAction), perfFields...)

// imexFields are the global IMEX status fields.
var imexFields = []Field{FieldIMEXDomainStatus, FieldIMEXDaemonStatus}

// laneField places a per-link NVLink counter field: the total it adds up to
// and the link it counts.
type laneField struct {
	total Field
	link  int
}

// perLinkFields maps DCGM's per-link NVLink error fields (DCGM_FI_DEV_NVLINK_
// <counter>_ERROR_L<n>_TOTAL) to their counter's total and their link, so a
// policy violation that names one can be pinned to "<UUID>/link-<n>". The
// ids are not contiguous: links 0-5 and 12-14 sit just below each total,
// 6-11 and 15-17 were added later in the 450s and 480s (dcgm_fields.h).
var perLinkFields = func() map[Field]laneField {
	m := map[Field]laneField{}
	add := func(total Field, first Field, links ...int) {
		for i, l := range links {
			m[first+Field(i)] = laneField{total: total, link: l}
		}
	}
	add(FieldNVLinkCRCFlitErrorTotal, 400, 0, 1, 2, 3, 4, 5, 12, 13, 14)
	add(FieldNVLinkCRCDataErrorTotal, 410, 0, 1, 2, 3, 4, 5, 12, 13, 14)
	add(FieldNVLinkReplayErrorTotal, 420, 0, 1, 2, 3, 4, 5, 12, 13, 14)
	add(FieldNVLinkRecoveryErrorTotal, 430, 0, 1, 2, 3, 4, 5, 12, 13, 14)
	add(FieldNVLinkCRCFlitErrorTotal, 451, 6, 7, 8, 9, 10, 11)
	add(FieldNVLinkCRCDataErrorTotal, 457, 6, 7, 8, 9, 10, 11)
	add(FieldNVLinkReplayErrorTotal, 463, 6, 7, 8, 9, 10, 11)
	add(FieldNVLinkRecoveryErrorTotal, 469, 6, 7, 8, 9, 10, 11)
	add(FieldNVLinkCRCFlitErrorTotal, 481, 15, 16, 17)
	add(FieldNVLinkCRCDataErrorTotal, 484, 15, 16, 17)
	add(FieldNVLinkReplayErrorTotal, 487, 15, 16, 17)
	add(FieldNVLinkRecoveryErrorTotal, 491, 15, 16, 17) // 490 is a different field
	return m
}()

// IMEX domain states (DCGM_FI_IMEX_DOMAIN_STATUS). DCGM writes the last
// three itself: nvidia-imex-ctl is not installed, IMEX is not configured, or
// the command failed, timed out or printed a status DCGM does not know.
const (
	imexDomainUp            = "UP"
	imexDomainDown          = "DOWN"
	imexDomainDegraded      = "DEGRADED"
	imexDomainNotInstalled  = "NOT_INSTALLED"
	imexDomainNotConfigured = "NOT_CONFIGURED"
	imexDomainUnavailable   = "UNAVAILABLE"
)

// imexDaemonReady is the READY value of DCGM_FI_IMEX_DAEMON_STATUS.
const imexDaemonReady = 5

// imexDaemonStates names the values of DCGM_FI_IMEX_DAEMON_STATUS for messages.
var imexDaemonStates = map[int64]string{
	0:  "INITIALIZING",
	1:  "STARTING_AUTH_SERVER",
	2:  "WAITING_FOR_PEERS",
	3:  "WAITING_FOR_RECOVERY",
	4:  "INIT_GPU",
	5:  "READY",
	6:  "SHUTTING_DOWN",
	7:  "UNAVAILABLE",
	-1: "NOT_INSTALLED",
	-2: "NOT_CONFIGURED",
	-3: "COMMAND_ERROR",
}

// recoveryAction is a value of DCGM_FI_DEV_GPU_RECOVERY_ACTION (NVML's
// nvmlDeviceGpuRecoveryAction_t).
type recoveryAction int64

// The GPU recovery actions.
const (
	// recoveryNone: the GPU needs nothing.
	recoveryNone recoveryAction = 0
	// recoveryReset: the GPU needs a reset.
	recoveryReset recoveryAction = 1
	// recoveryReboot: the node needs a reboot.
	recoveryReboot recoveryAction = 2
	// recoveryDrainP2P: peer-to-peer traffic must be quiesced; no reset.
	recoveryDrainP2P recoveryAction = 3
	// recoveryDrainAndReset: the GPU runs at reduced capacity; drain it and
	// reset it.
	recoveryDrainAndReset recoveryAction = 4
)

// recoveryActionNames names the recovery actions for messages.
var recoveryActionNames = map[recoveryAction]string{
	recoveryNone:          "NONE",
	recoveryReset:         "GPU_RESET",
	recoveryReboot:        "NODE_REBOOT",
	recoveryDrainP2P:      "DRAIN_P2P",
	recoveryDrainAndReset: "DRAIN_AND_RESET",
}
