//go:build cgo

package dcgm

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	godcgm "github.com/NVIDIA/go-dcgm/pkg/dcgm"
	. "github.com/onsi/gomega"

	"github.com/gpuhealth/gpuhealth/monitors"
)

func TestInitError(t *testing.T) {
	tests := []struct {
		name            string
		err             error
		wantUnavailable bool
	}{
		{
			name:            "a missing library means DCGM is unavailable on this node",
			err:             errors.New("libdcgm.so.4 not found"),
			wantUnavailable: true,
		},
		{
			name: "a host engine that does not answer is an error",
			err:  errors.New("error connecting to nv-hostengine: Host engine connection invalid/disconnected"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			err := initError(tt.err)
			g.Expect(errors.Is(err, monitors.ErrUnavailable)).To(Equal(tt.wantUnavailable))
			if tt.wantUnavailable {
				g.Expect(err).To(MatchError(ContainSubstring("libdcgm.so.4 not found")))
			}
		})
	}
}

// TestConnectWithoutDCGM runs go-dcgm's real Init. Where libdcgm.so.4 is
// installed it would start DCGM, which is not what this test is about, so
// it is skipped there.
func TestConnectWithoutDCGM(t *testing.T) {
	for _, cfg := range []ClientConfig{
		{Mode: ModeEmbedded},
		{Mode: ModeStandalone, Address: DefaultAddress},
	} {
		t.Run(string(cfg.Mode)+" mode without libdcgm.so.4 is unavailable", func(t *testing.T) {
			g := NewWithT(t)
			c, err := Connect(context.Background(), cfg)
			if err == nil {
				_ = c.Close()
				t.Skip("libdcgm.so.4 is installed here")
			}
			if !errors.Is(err, monitors.ErrUnavailable) {
				t.Skipf("DCGM is installed here but did not start: %v", err)
			}
			g.Expect(err).To(MatchError(ContainSubstring("libdcgm.so.4 not found")))
		})
	}
}

func TestEntityFromGoDCGM(t *testing.T) {
	tests := []struct {
		name   string
		entity godcgm.GroupEntityPair
		want   Entity
	}{
		{
			name:   "a GPU keeps its id",
			entity: godcgm.GroupEntityPair{EntityGroupId: godcgm.FE_GPU, EntityId: 3},
			want:   Entity{Kind: EntityGPU, ID: 3},
		},
		{
			name:   "a switch keeps its id",
			entity: godcgm.GroupEntityPair{EntityGroupId: godcgm.FE_SWITCH, EntityId: 1},
			want:   Entity{Kind: EntitySwitch, ID: 1},
		},
		{
			name:   "no entity is the node",
			entity: godcgm.GroupEntityPair{EntityGroupId: godcgm.FE_NONE},
			want:   Entity{Kind: EntityNone},
		},
		{
			name:   "a GPU link unpacks its parent and port index",
			entity: godcgm.GroupEntityPair{EntityGroupId: godcgm.FE_LINK, EntityId: uint(godcgm.FE_GPU) | 17<<8 | 6<<24},
			want:   Entity{Kind: EntityLink, Parent: EntityGPU, ID: 6, Link: 17},
		},
		{
			name:   "a switch link unpacks its parent and port index",
			entity: godcgm.GroupEntityPair{EntityGroupId: godcgm.FE_LINK, EntityId: uint(godcgm.FE_SWITCH) | 63<<8 | 2<<24},
			want:   Entity{Kind: EntityLink, Parent: EntitySwitch, ID: 2, Link: 63},
		},
		{
			name:   "a CPU is another entity",
			entity: godcgm.GroupEntityPair{EntityGroupId: godcgm.FE_CPU, EntityId: 0},
			want:   Entity{Kind: EntityOther},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			NewWithT(t).Expect(entityFromGoDCGM(tt.entity)).To(Equal(tt.want))
		})
	}
}

func TestViolationFromGoDCGM(t *testing.T) {
	at := time.Unix(1772366400, 0)
	tests := []struct {
		name      string
		violation godcgm.PolicyViolation
		want      Violation
	}{
		{
			name:      "an XID condition carries its number",
			violation: godcgm.PolicyViolation{GPU: 2, Condition: godcgm.XidPolicy, Timestamp: at, Data: godcgm.XidPolicyCondition{ErrNum: 79}},
			want:      Violation{Kind: ViolationXID, GPU: 2, Time: at, XID: 79},
		},
		{
			name:      "an NVLink condition carries its field and counter",
			violation: godcgm.PolicyViolation{GPU: 1, Condition: godcgm.NvlinkPolicy, Timestamp: at, Data: godcgm.NvlinkPolicyCondition{FieldId: 409, Counter: 12}},
			want:      Violation{Kind: ViolationNVLink, GPU: 1, Time: at, Field: FieldNVLinkCRCFlitErrorTotal, Counter: 12},
		},
		{
			name:      "any other condition is other",
			violation: godcgm.PolicyViolation{GPU: 0, Condition: godcgm.ThermalPolicy, Timestamp: at, Data: godcgm.ThermalPolicyCondition{ThermalViolation: 1}},
			want:      Violation{Kind: ViolationOther, GPU: 0, Time: at},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			NewWithT(t).Expect(violationFromGoDCGM(tt.violation)).To(Equal(tt.want))
		})
	}
}

func TestFieldValues(t *testing.T) {
	intValue := func(v int64) [4096]byte {
		var b [4096]byte
		binary.LittleEndian.PutUint64(b[:], uint64(v))
		return b
	}
	strValue := func(s string) [4096]byte {
		var b [4096]byte
		copy(b[:], s)
		return b
	}
	ts := time.UnixMicro(1772366400123456) // local time, as DCGM timestamps are read
	tests := []struct {
		name  string
		value godcgm.FieldValue_v1
		want  FieldValue
	}{
		{
			name:  "an integer with a timestamp is valid",
			value: godcgm.FieldValue_v1{FieldType: godcgm.DCGM_FT_INT64, Status: godcgm.DCGM_ST_OK, TS: ts.UnixMicro(), Value: intValue(1234)},
			want:  FieldValue{Field: FieldNVLinkCRCFlitErrorTotal, Valid: true, Int: 1234, Time: ts},
		},
		{
			name:  "a blank integer is not valid",
			value: godcgm.FieldValue_v1{FieldType: godcgm.DCGM_FT_INT64, Status: godcgm.DCGM_ST_OK, TS: ts.UnixMicro(), Value: intValue(godcgm.DCGM_FT_INT64_NOT_SUPPORTED)},
			want:  FieldValue{Field: FieldNVLinkCRCFlitErrorTotal, Time: ts},
		},
		{
			name:  "a string is valid",
			value: godcgm.FieldValue_v1{FieldType: godcgm.DCGM_FT_STRING, Status: godcgm.DCGM_ST_OK, Value: strValue("DOWN")},
			want:  FieldValue{Field: FieldNVLinkCRCFlitErrorTotal, Valid: true, String: "DOWN"},
		},
		{
			name:  "a blank string is not valid",
			value: godcgm.FieldValue_v1{FieldType: godcgm.DCGM_FT_STRING, Status: godcgm.DCGM_ST_OK, Value: strValue(godcgm.DCGM_FT_STR_BLANK)},
			want:  FieldValue{Field: FieldNVLinkCRCFlitErrorTotal},
		},
		{
			name:  "a value DCGM could not read is not valid",
			value: godcgm.FieldValue_v1{FieldType: godcgm.DCGM_FT_INT64, Status: godcgm.DCGM_ST_NOT_WATCHED, Value: intValue(5)},
			want:  FieldValue{Field: FieldNVLinkCRCFlitErrorTotal},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := fieldValues([]Field{FieldNVLinkCRCFlitErrorTotal}, []godcgm.FieldValue_v1{tt.value})
			NewWithT(t).Expect(got).To(Equal([]FieldValue{tt.want}))
		})
	}
	t.Run("a field DCGM returned no value for is not valid", func(t *testing.T) {
		got := fieldValues([]Field{FieldIMEXDomainStatus, FieldIMEXDaemonStatus}, nil)
		NewWithT(t).Expect(got).To(Equal([]FieldValue{{Field: FieldIMEXDomainStatus}, {Field: FieldIMEXDaemonStatus}}))
	})
}

// TestConstantsMatchGoDCGM checks the package's copies of DCGM's numbers
// against go-dcgm's names for them.
func TestConstantsMatchGoDCGM(t *testing.T) {
	g := NewWithT(t)
	g.Expect(DefaultHealthSystems).To(Equal(HealthSystem(godcgm.DCGM_HEALTH_WATCH_MEM | godcgm.DCGM_HEALTH_WATCH_PCIE |
		godcgm.DCGM_HEALTH_WATCH_INFOROM | godcgm.DCGM_HEALTH_WATCH_THERMAL | godcgm.DCGM_HEALTH_WATCH_POWER |
		godcgm.DCGM_HEALTH_WATCH_NVLINK | godcgm.DCGM_HEALTH_WATCH_NVSWITCH_FATAL | godcgm.DCGM_HEALTH_WATCH_NVSWITCH_NONFATAL |
		godcgm.DCGM_HEALTH_WATCH_IMEX)))
	g.Expect(HealthWarn).To(Equal(HealthResult(godcgm.DCGM_HEALTH_RESULT_WARN)))
	g.Expect(HealthFail).To(Equal(HealthResult(godcgm.DCGM_HEALTH_RESULT_FAIL)))
	g.Expect(FieldGPURecoveryAction).To(Equal(Field(godcgm.DCGM_FI_DEV_GPU_RECOVERY_ACTION)))
	g.Expect(FieldIMEXDomainStatus).To(Equal(Field(godcgm.DCGM_FI_IMEX_DOMAIN_STATUS)))
	g.Expect(FieldIMEXDaemonStatus).To(Equal(Field(godcgm.DCGM_FI_IMEX_DAEMON_STATUS)))
	// go-dcgm names the clocks-event codes by their older CLOCK_THROTTLE
	// names.
	byName := map[string]godcgm.HealthCheckErrorCode{
		"DCGM_FR_PCI_REPLAY_RATE": godcgm.DCGM_FR_PCI_REPLAY_RATE, "DCGM_FR_VOLATILE_DBE_DETECTED": godcgm.DCGM_FR_VOLATILE_DBE_DETECTED,
		"DCGM_FR_VOLATILE_SBE_DETECTED": godcgm.DCGM_FR_VOLATILE_SBE_DETECTED, "DCGM_FR_PENDING_PAGE_RETIREMENTS": godcgm.DCGM_FR_PENDING_PAGE_RETIREMENTS,
		"DCGM_FR_RETIRED_PAGES_LIMIT": godcgm.DCGM_FR_RETIRED_PAGES_LIMIT, "DCGM_FR_RETIRED_PAGES_DBE_LIMIT": godcgm.DCGM_FR_RETIRED_PAGES_DBE_LIMIT,
		"DCGM_FR_CORRUPT_INFOROM": godcgm.DCGM_FR_CORRUPT_INFOROM, "DCGM_FR_CLOCKS_EVENT_THERMAL": godcgm.DCGM_FR_CLOCK_THROTTLE_THERMAL,
		"DCGM_FR_POWER_UNREADABLE": godcgm.DCGM_FR_POWER_UNREADABLE, "DCGM_FR_CLOCKS_EVENT_POWER": godcgm.DCGM_FR_CLOCK_THROTTLE_POWER,
		"DCGM_FR_NVLINK_ERROR_THRESHOLD": godcgm.DCGM_FR_NVLINK_ERROR_THRESHOLD, "DCGM_FR_NVLINK_DOWN": godcgm.DCGM_FR_NVLINK_DOWN,
		"DCGM_FR_NVSWITCH_FATAL_ERROR": godcgm.DCGM_FR_NVSWITCH_FATAL_ERROR, "DCGM_FR_NVSWITCH_NON_FATAL_ERROR": godcgm.DCGM_FR_NVSWITCH_NON_FATAL_ERROR,
		"DCGM_FR_NVSWITCH_DOWN": godcgm.DCGM_FR_NVSWITCH_DOWN, "DCGM_FR_FIELD_VIOLATION": godcgm.DCGM_FR_FIELD_VIOLATION,
		"DCGM_FR_THERMAL_VIOLATIONS": godcgm.DCGM_FR_THERMAL_VIOLATIONS, "DCGM_FR_THERMAL_VIOLATIONS_TS": godcgm.DCGM_FR_THERMAL_VIOLATIONS_TS,
		"DCGM_FR_TEMP_VIOLATION": godcgm.DCGM_FR_TEMP_VIOLATION, "DCGM_FR_CLOCKS_EVENT_VIOLATION": godcgm.DCGM_FR_THROTTLING_VIOLATION,
		"DCGM_FR_FAULTY_MEMORY": godcgm.DCGM_FR_FAULTY_MEMORY, "DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD": godcgm.DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD,
		"DCGM_FR_NVLINK_ERROR_CRITICAL": godcgm.DCGM_FR_NVLINK_ERROR_CRITICAL, "DCGM_FR_ROW_REMAP_FAILURE": godcgm.DCGM_FR_ROW_REMAP_FAILURE,
		"DCGM_FR_UNCONTAINED_ERROR": godcgm.DCGM_FR_UNCONTAINED_ERROR, "DCGM_FR_DBE_PENDING_PAGE_RETIREMENTS": godcgm.DCGM_FR_DBE_PENDING_PAGE_RETIREMENTS,
		"DCGM_FR_UNCORRECTABLE_ROW_REMAP": godcgm.DCGM_FR_UNCORRECTABLE_ROW_REMAP, "DCGM_FR_PENDING_ROW_REMAP": godcgm.DCGM_FR_PENDING_ROW_REMAP,
		"DCGM_FR_NVSWITCH_NVLINK_DOWN": godcgm.DCGM_FR_NVSWITCH_NVLINK_DOWN, "DCGM_FR_GPU_EXPECTED_NVLINKS_UP": godcgm.DCGM_FR_GPU_EXPECTED_NVLINKS_UP,
		"DCGM_FR_NVSWITCH_EXPECTED_NVLINKS_UP": godcgm.DCGM_FR_NVSWITCH_EXPECTED_NVLINKS_UP, "DCGM_FR_XID_ERROR": godcgm.DCGM_FR_XID_ERROR,
		"DCGM_FR_SXID_ERROR": godcgm.DCGM_FR_SXID_ERROR, "DCGM_FR_FABRIC_MANAGER_TRAINING_ERROR": godcgm.DCGM_FR_FABRIC_MANAGER_TRAINING_ERROR,
		"DCGM_FR_NVLINK_EFFECTIVE_BER_THRESHOLD": godcgm.DCGM_FR_NVLINK_EFFECTIVE_BER_THRESHOLD, "DCGM_FR_FALLEN_OFF_BUS": godcgm.DCGM_FR_FALLEN_OFF_BUS,
		"DCGM_FR_NVLINK_SYMBOL_BER_THRESHOLD": godcgm.DCGM_FR_NVLINK_SYMBOL_BER_THRESHOLD, "DCGM_FR_IMEX_UNHEALTHY": godcgm.DCGM_FR_IMEX_UNHEALTHY,
		"DCGM_FR_FABRIC_PROBE_STATE": godcgm.DCGM_FR_FABRIC_PROBE_STATE, "DCGM_FR_CONTAINED_ERROR": godcgm.DCGM_FR_CONTAINED_ERROR,
		"DCGM_FR_UNCORRECTABLE_ROW_REMAP_LIMIT": godcgm.DCGM_FR_UNCORRECTABLE_ROW_REMAP_LIMIT,
	}
	g.Expect(byName).To(HaveLen(len(incidentRules)))
	for code, rule := range incidentRules {
		want, ok := byName[rule.name]
		g.Expect(ok).To(BeTrue(), "%s has no go-dcgm name here", rule.name)
		g.Expect(uint(code)).To(Equal(uint(want)), rule.name)
	}
}
