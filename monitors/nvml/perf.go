package nvml

import (
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
	"github.com/gpuhealth/gpuhealth/monitors/slowgpu"
)

// perfState is what the slow-GPU checks need to remember about one GPU
// beyond the judge's history.
type perfState struct {
	judge *slowgpu.Judge
	// off holds the signals NVML does not support on this GPU.
	off map[string]bool
	// legacySpeed is set once the scoped NVLink speed field is found
	// unsupported: the per-link fields of older drivers are read instead.
	legacySpeed bool
}

// supported says whether a read of signal succeeded. NOT_SUPPORTED turns
// the signal off for the GPU, logged once; a lost GPU is errLost; any other
// error is taken as transient (the next poll reads again).
func (s *Source) supported(d *device, signal string, ret gonvml.Return) (bool, error) {
	switch ret {
	case gonvml.SUCCESS:
		return true, nil
	case gonvml.ERROR_GPU_IS_LOST:
		return false, errLost
	case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_FUNCTION_NOT_FOUND:
		s.turnOff(d, signal)
	}
	return false, nil
}

// turnOff stops reading signal on the GPU, and says so once.
func (s *Source) turnOff(d *device, signal string) {
	if d.perf.off[signal] {
		return
	}
	d.perf.off[signal] = true
	s.Log.Info("GPU does not report this signal; its check is off for this GPU", "gpu", d.uuid, "signal", signal)
}

// pollPerformance reads one GPU's slow-GPU signals and judges them; up
// lists its NVLinks that are up.
func (s *Source) pollPerformance(now time.Time, d *device, up []int, tracker *monitors.Tracker, report monitors.Reporter) error {
	if d.perf == nil {
		d.perf = &perfState{
			judge: &slowgpu.Judge{Source: gpuhealthv1alpha1.SourceNVML, Index: d.index, UUID: d.uuid, Config: s.Performance, Metrics: true},
			off:   map[string]bool{},
		}
	}
	var r slowgpu.Reading
	for _, read := range []func(*device, *slowgpu.Reading) error{s.readClocks, s.readPCIe, s.readMemory, s.readTemperature} {
		if err := read(d, &r); err != nil {
			return err
		}
	}
	if len(up) >= 2 && !d.perf.off["nvlink speed"] {
		speeds, err := s.readLinkSpeeds(d, up)
		if err != nil {
			return err
		}
		r.LinkSpeeds = speeds
	}
	d.perf.judge.Observe(now, r, tracker, report)
	return nil
}

// read runs get for signal unless it is off, and says whether it gave a value.
func (s *Source) read(d *device, signal string, get func() gonvml.Return) (bool, error) {
	if d.perf.off[signal] {
		return false, nil
	}
	return s.supported(d, signal, get())
}

func (s *Source) readClocks(d *device, r *slowgpu.Reading) error {
	var ck slowgpu.Clocks
	ok, err := s.read(d, "clocks event reasons", func() (ret gonvml.Return) {
		if s.symbols.clocksEventReasons {
			ck.Reasons, ret = d.handle.GetCurrentClocksEventReasons()
		} else {
			ck.Reasons, ret = d.handle.GetCurrentClocksThrottleReasons() // drivers before 535
		}
		return ret
	})
	if err != nil {
		return err
	}
	if ok {
		ck.SM, _ = d.handle.GetClockInfo(gonvml.CLOCK_SM)
		ck.SMMax, _ = d.handle.GetMaxClockInfo(gonvml.CLOCK_SM)
		r.Clocks = &ck
	}
	for policy, p := range map[slowgpu.Policy]gonvml.PerfPolicyType{
		slowgpu.PolicyThermal: gonvml.PERF_POLICY_THERMAL, slowgpu.PolicyReliability: gonvml.PERF_POLICY_RELIABILITY, slowgpu.PolicyPower: gonvml.PERF_POLICY_POWER,
	} {
		var vt gonvml.ViolationTime
		ok, err := s.read(d, "violation time "+string(policy), func() (ret gonvml.Return) {
			vt, ret = d.handle.GetViolationStatus(p)
			return ret
		})
		if err != nil {
			return err
		}
		if ok {
			if r.Violations == nil {
				r.Violations = map[slowgpu.Policy]time.Duration{}
			}
			r.Violations[policy] = time.Duration(vt.ViolationTime) // nanoseconds
		}
	}
	return nil
}

func (s *Source) readPCIe(d *device, r *slowgpu.Reading) error {
	var p slowgpu.PCIe
	ok, err := s.read(d, "pcie link", func() (ret gonvml.Return) {
		p.Generation, ret = d.handle.GetCurrPcieLinkGeneration()
		return ret
	})
	if err != nil {
		return err
	}
	if ok {
		// A value that could not be read stays 0, which the judge reads as
		// "not read", never as a link of width 0.
		p.Width = readOr0(d.handle.GetCurrPcieLinkWidth())
		p.MaxGeneration = readOr0(d.handle.GetMaxPcieLinkGeneration())
		if p.MaxGeneration == 0 && s.symbols.gpuMaxPcieLinkGeneration {
			p.MaxGeneration = readOr0(d.handle.GetGpuMaxPcieLinkGeneration())
		}
		p.MaxWidth = readOr0(d.handle.GetMaxPcieLinkWidth())
		// Without utilisation an idle link cannot be told from a slow one.
		ok, err = s.read(d, "utilization", func() gonvml.Return {
			u, ret := d.handle.GetUtilizationRates()
			p.Utilization = u.Gpu
			return ret
		})
		if err != nil {
			return err
		}
		if ok {
			r.PCIe = &p
		}
	}
	var replays int
	ok, err = s.read(d, "pcie replays", func() (ret gonvml.Return) {
		replays, ret = d.handle.GetPcieReplayCounter()
		return ret
	})
	if ok {
		v := uint64(replays)
		r.Replays = &v
	}
	return err
}

func (s *Source) readMemory(d *device, r *slowgpu.Reading) error {
	var m slowgpu.Remap
	ok, err := s.read(d, "row remapping", func() (ret gonvml.Return) {
		m.Correctable, m.Uncorrectable, m.Pending, m.Failed, ret = d.handle.GetRemappedRows()
		return ret
	})
	if err != nil {
		return err
	}
	if ok {
		r.Remap = &m
	}
	var pending gonvml.EnableState
	ok, err = s.read(d, "retired pages", func() (ret gonvml.Return) {
		pending, ret = d.handle.GetRetiredPagesPendingStatus()
		return ret
	})
	if err != nil {
		return err
	}
	if ok {
		p := pending == gonvml.FEATURE_ENABLED
		r.RetiredPending = &p
	}
	var ecc uint64
	ok, err = s.read(d, "ecc", func() (ret gonvml.Return) {
		ecc, ret = d.handle.GetTotalEccErrors(gonvml.MEMORY_ERROR_TYPE_UNCORRECTED, gonvml.VOLATILE_ECC)
		return ret
	})
	if ok {
		r.VolatileUncorrected = &ecc
	}
	return err
}

func (s *Source) readTemperature(d *device, r *slowgpu.Reading) error {
	var t slowgpu.Temperature
	ok, err := s.read(d, "temperature", func() (ret gonvml.Return) {
		if t.GPU, ret = d.handle.GetTemperature(gonvml.TEMPERATURE_GPU); ret != gonvml.SUCCESS {
			return ret
		}
		t.Slowdown, ret = d.handle.GetTemperatureThreshold(gonvml.TEMPERATURE_THRESHOLD_SLOWDOWN)
		return ret
	})
	if ok {
		r.Temperature = &t
	}
	return err
}

// LegacySpeedField is the per-link speed field of drivers without the
// scoped NVML_FI_DEV_NVLINK_GET_SPEED: links 0-5 and 6-11 only.
func LegacySpeedField(link int) (uint32, bool) {
	switch {
	case link < 6:
		return gonvml.FI_DEV_NVLINK_SPEED_MBPS_L0 + uint32(link), true
	case link < 12:
		return gonvml.FI_DEV_NVLINK_SPEED_MBPS_L6 + uint32(link-6), true
	}
	return 0, false
}

// readLinkSpeeds reads the speed of each link in up, in MB/s, in one call.
func (s *Source) readLinkSpeeds(d *device, up []int) (map[int]uint64, error) {
	values := make([]gonvml.FieldValue, 0, len(up))
	for _, l := range up {
		if !d.perf.legacySpeed {
			values = append(values, gonvml.FieldValue{FieldId: gonvml.FI_DEV_NVLINK_GET_SPEED, ScopeId: uint32(l)})
		} else if id, ok := LegacySpeedField(l); ok {
			values = append(values, gonvml.FieldValue{FieldId: id, ScopeId: uint32(l)})
		}
	}
	if len(values) == 0 {
		s.turnOff(d, "nvlink speed")
		return nil, nil
	}
	if ok, err := s.supported(d, "nvlink speed", d.handle.GetFieldValues(values)); !ok {
		return nil, err
	}
	speeds := map[int]uint64{}
	unsupported := 0
	for _, v := range values {
		switch gonvml.Return(v.NvmlReturn) {
		case gonvml.SUCCESS:
			if x, ok := fieldUint(v); ok {
				speeds[int(v.ScopeId)] = x
			}
		case gonvml.ERROR_GPU_IS_LOST:
			return nil, errLost
		case gonvml.ERROR_NOT_SUPPORTED:
			unsupported++
		}
	}
	if unsupported == len(values) {
		if !d.perf.legacySpeed {
			d.perf.legacySpeed = true
			return s.readLinkSpeeds(d, up)
		}
		s.turnOff(d, "nvlink speed")
	}
	return speeds, nil
}

// fieldUint decodes an unsigned field value (little-endian, as NVML's
// union is on the platforms it runs on).
func fieldUint(v gonvml.FieldValue) (uint64, bool) {
	var x uint64
	switch gonvml.ValueType(v.ValueType) {
	case gonvml.VALUE_TYPE_UNSIGNED_INT:
		for i := 3; i >= 0; i-- {
			x = x<<8 | uint64(v.Value[i])
		}
	case gonvml.VALUE_TYPE_UNSIGNED_LONG, gonvml.VALUE_TYPE_UNSIGNED_LONG_LONG:
		for i := 7; i >= 0; i-- {
			x = x<<8 | uint64(v.Value[i])
		}
	default:
		return 0, false
	}
	return x, true
}

// readOr0 is an NVML read's value when it succeeded, else 0.
func readOr0(v int, ret gonvml.Return) int {
	if ret != gonvml.SUCCESS {
		return 0
	}
	return v
}
