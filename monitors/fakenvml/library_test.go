package fakenvml

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	. "github.com/onsi/gomega"
)

const (
	uuid0 = "GPU-5a1c3e52-8f0b-4c2e-9d36-2b7f0a4c1e01"
	uuid1 = "GPU-5a1c3e52-8f0b-4c2e-9d36-2b7f0a4c1e02"
	uuid2 = "GPU-5a1c3e52-8f0b-4c2e-9d36-2b7f0a4c1e03"
)

// TestLibrary drives the built library through go-nvml, as the monitor does.
// The library's state is per process, so the steps run in order and share it;
// the scenario's times are relative to Init unless they start with @.
func TestLibrary(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not found")
	}
	g := NewWithT(t)
	dir := t.TempDir()
	lib, err := Build(dir)
	g.Expect(err).NotTo(HaveOccurred())

	scenario := filepath.Join(dir, "scenario")
	t.Setenv(ScenarioEnv, scenario)
	old := At(time.Now().Add(-time.Hour))
	writeFile(t, scenario, strings.Join([]string{
		`device index=0 uuid=` + uuid0 + ` pci=0000:3b:00.0 name="NVIDIA H200" links=18`,
		`device index=1 uuid=` + uuid1 + ` pci=0000:5c:00.0 name="NVIDIA H200" links=18`,
		`device index=2 uuid=` + uuid2 + ` pci=0000:9a:00.0 name="NVIDIA H200" links=0`,
		`xid device=0 code=79 at=1s`,
		`xid device=1 code=48 at=` + old + ` # before Init: never delivered`,
		`nvlink device=0 link=3 counter=crc_flit rate=5000 from=0s for=1h`,
		`nvlink device=0 link=4 counter=replay value=100`,
		`nvlink device=0 link=5 counter=crc_data rate=1000 for=500ms`,
		`linkstate device=0 link=3 state=down at=1500ms`,
		`fabric device=0 state=completed health=healthy status=success clique=7 mask=2 cluster=01234567-89ab-cdef-0123-456789abcdef`,
		`fabric device=1 state=in_progress health=unhealthy at=` + old + ` # state from the past applies`,
		`fabric device=1 state=completed at=1h`,
		`clocks device=0 reasons=hw_thermal,hw_slowdown sm=1200`,
		`clocks device=0 reasons=none at=1h`,
		`pcie device=0 gen=4 width=8`,
		`pcireplay device=0 rate=1000 for=1h`,
		`util device=0 gpu=95 memory=30`,
		`remap device=0 corr=1 uncorr=2 pending=yes`,
		`retired device=0 pending=no`,
		`ecc device=0 value=5`,
		`temp device=0 gpu=87 slowdown=89`,
		`nvlinkspeed device=0 link=2 mbps=13281`,
		`this line is malformed`,
	}, "\n"))

	n := nvml.New(nvml.WithLibraryPath(lib))
	initAt := time.Now()
	g.Expect(n.Init()).To(Equal(nvml.SUCCESS))
	devices := make([]nvml.Device, 3)

	t.Run("devices have the scenario's identity", func(t *testing.T) {
		g := NewWithT(t)
		count, ret := n.DeviceGetCount()
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		g.Expect(count).To(Equal(3))
		for i, want := range []struct{ uuid, busID, legacy string }{
			{uuid0, "00000000:3B:00.0", "0000:3B:00.0"},
			{uuid1, "00000000:5C:00.0", "0000:5C:00.0"},
			{uuid2, "00000000:9A:00.0", "0000:9A:00.0"},
		} {
			d, ret := n.DeviceGetHandleByIndex(i)
			g.Expect(ret).To(Equal(nvml.SUCCESS))
			devices[i] = d
			g.Expect(d.GetUUID()).To(Equal(want.uuid))
			g.Expect(d.GetName()).To(Equal("NVIDIA H200"))
			g.Expect(d.GetIndex()).To(Equal(i))
			g.Expect(d.GetMinorNumber()).To(Equal(i))
			pci, ret := d.GetPciInfo()
			g.Expect(ret).To(Equal(nvml.SUCCESS))
			g.Expect(cString(pci.BusId[:])).To(Equal(want.busID))
			g.Expect(cString(pci.BusIdLegacy[:])).To(Equal(want.legacy))
			g.Expect(pci.PciDeviceId).To(Equal(uint32(0x233510DE)))

			byUUID, ret := n.DeviceGetHandleByUUID(want.uuid)
			g.Expect(ret).To(Equal(nvml.SUCCESS))
			g.Expect(byUUID.GetIndex()).To(Equal(i))
			byPCI, ret := n.DeviceGetHandleByPciBusId(strings.ToLower(want.legacy))
			g.Expect(ret).To(Equal(nvml.SUCCESS))
			g.Expect(byPCI.GetIndex()).To(Equal(i))
		}
		_, ret = n.DeviceGetHandleByIndex(3)
		g.Expect(ret).To(Equal(nvml.ERROR_INVALID_ARGUMENT))
		_, ret = n.DeviceGetHandleByUUID("GPU-nope")
		g.Expect(ret).To(Equal(nvml.ERROR_NOT_FOUND))
		g.Expect(n.SystemGetDriverVersion()).To(Equal("570.133.20"))
		g.Expect(nvml.ERROR_GPU_IS_LOST.Error()).To(Equal("GPU is lost"))
	})

	set, ret := n.EventSetCreate()
	g.Expect(ret).To(Equal(nvml.SUCCESS))

	t.Run("an XID arrives once, at its time, while other calls go on", func(t *testing.T) {
		g := NewWithT(t)
		for _, d := range devices {
			supported, ret := d.GetSupportedEventTypes()
			g.Expect(ret).To(Equal(nvml.SUCCESS))
			g.Expect(supported & nvml.EventTypeXidCriticalError).NotTo(BeZero())
			g.Expect(d.RegisterEvents(nvml.EventTypeXidCriticalError, set)).To(Equal(nvml.SUCCESS))
		}
		type result struct {
			data nvml.EventData
			ret  nvml.Return
		}
		done := make(chan result, 1)
		go func() {
			data, ret := set.Wait(5000)
			done <- result{data, ret}
		}()
		// The waiter must not hold the library: a counter read stays quick.
		start := time.Now()
		_, ret := devices[0].GetNvLinkErrorCounter(3, nvml.NVLINK_ERROR_DL_CRC_FLIT)
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		g.Expect(time.Since(start)).To(BeNumerically("<", 200*time.Millisecond))

		var got result
		g.Eventually(done).WithTimeout(6 * time.Second).Should(Receive(&got))
		g.Expect(got.ret).To(Equal(nvml.SUCCESS))
		g.Expect(time.Since(initAt)).To(BeNumerically(">=", time.Second))
		g.Expect(got.data.EventType).To(Equal(uint64(nvml.EventTypeXidCriticalError)))
		g.Expect(got.data.EventData).To(Equal(uint64(79)))
		g.Expect(got.data.GpuInstanceId).To(Equal(uint32(0xFFFFFFFF)))
		g.Expect(got.data.ComputeInstanceId).To(Equal(uint32(0xFFFFFFFF)))
		g.Expect(got.data.Device.GetUUID()).To(Equal(uuid0))

		// Neither XID 79 again nor XID 48, which is older than Init.
		_, ret = set.Wait(300)
		g.Expect(ret).To(Equal(nvml.ERROR_TIMEOUT))
	})

	t.Run("NVLink counters ramp, stop and reset as configured", func(t *testing.T) {
		g := NewWithT(t)
		d := devices[0]
		before := time.Now()
		first, ret := d.GetNvLinkErrorCounter(3, nvml.NVLINK_ERROR_DL_CRC_FLIT)
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		afterFirst := time.Now()
		time.Sleep(200 * time.Millisecond)
		beforeSecond := time.Now()
		second, ret := d.GetNvLinkErrorCounter(3, nvml.NVLINK_ERROR_DL_CRC_FLIT)
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		after := time.Now()
		// 5000/s between the reads, with the reads' own time as the slack.
		g.Expect(second - first).To(BeNumerically(">=", uint64(5000*beforeSecond.Sub(afterFirst).Seconds())-1))
		g.Expect(second - first).To(BeNumerically("<=", uint64(5000*after.Sub(before).Seconds())+1))

		// The 500 ms ramp at 1000/s has stopped at 500.
		g.Expect(d.GetNvLinkErrorCounter(5, nvml.NVLINK_ERROR_DL_CRC_DATA)).To(Equal(uint64(500)))
		g.Expect(d.GetNvLinkErrorCounter(4, nvml.NVLINK_ERROR_DL_REPLAY)).To(Equal(uint64(100)))
		g.Expect(d.GetNvLinkErrorCounter(4, nvml.NVLINK_ERROR_DL_CRC_FLIT)).To(Equal(uint64(0)))

		g.Expect(d.ResetNvLinkErrorCounters(4)).To(Equal(nvml.SUCCESS))
		g.Expect(d.GetNvLinkErrorCounter(4, nvml.NVLINK_ERROR_DL_REPLAY)).To(Equal(uint64(0)))
		g.Expect(d.GetNvLinkErrorCounter(3, nvml.NVLINK_ERROR_DL_CRC_FLIT)).To(BeNumerically(">=", second))

		_, ret = d.GetNvLinkErrorCounter(18, nvml.NVLINK_ERROR_DL_REPLAY)
		g.Expect(ret).To(Equal(nvml.ERROR_INVALID_ARGUMENT))
		_, ret = d.GetNvLinkErrorCounter(0, nvml.NvLinkErrorCounter(5))
		g.Expect(ret).To(Equal(nvml.ERROR_INVALID_ARGUMENT))
		_, ret = devices[2].GetNvLinkErrorCounter(0, nvml.NVLINK_ERROR_DL_REPLAY)
		g.Expect(ret).To(Equal(nvml.ERROR_NOT_SUPPORTED))
	})

	t.Run("a link goes down at its time", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(func() nvml.EnableState {
			state, _ := devices[0].GetNvLinkState(3)
			return state
		}).WithTimeout(3 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal(nvml.FEATURE_DISABLED))
		g.Expect(time.Since(initAt)).To(BeNumerically(">=", 1500*time.Millisecond))
		g.Expect(devices[0].GetNvLinkState(4)).To(Equal(nvml.FEATURE_ENABLED))
		_, ret := devices[2].GetNvLinkState(0)
		g.Expect(ret).To(Equal(nvml.ERROR_NOT_SUPPORTED))
	})

	t.Run("fabric info comes in every version", func(t *testing.T) {
		g := NewWithT(t)
		cluster := [16]uint8{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef}

		v3, ret := devices[0].GetGpuFabricInfoV().V3()
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		g.Expect(v3.State).To(Equal(uint8(nvml.GPU_FABRIC_STATE_COMPLETED)))
		g.Expect(v3.HealthSummary).To(Equal(uint8(nvml.GPU_FABRIC_HEALTH_SUMMARY_HEALTHY)))
		g.Expect(v3.Status).To(Equal(uint32(nvml.SUCCESS)))
		g.Expect(v3.CliqueId).To(Equal(uint32(7)))
		g.Expect(v3.HealthMask).To(Equal(uint32(2)))
		g.Expect(v3.ClusterUuid).To(Equal(cluster))

		v2, ret := devices[0].GetGpuFabricInfoV().V2()
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		g.Expect(v2.CliqueId).To(Equal(uint32(7)))
		g.Expect(v2.HealthMask).To(Equal(uint32(2)))
		v1, ret := devices[0].GetGpuFabricInfo()
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		g.Expect(v1.State).To(Equal(uint8(nvml.GPU_FABRIC_STATE_COMPLETED)))
		g.Expect(v1.ClusterUuid).To(Equal(cluster))

		v3, ret = devices[1].GetGpuFabricInfoV().V3()
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		g.Expect(v3.State).To(Equal(uint8(nvml.GPU_FABRIC_STATE_IN_PROGRESS)))
		g.Expect(v3.HealthSummary).To(Equal(uint8(nvml.GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY)))

		_, ret = devices[2].GetGpuFabricInfoV().V3()
		g.Expect(ret).To(Equal(nvml.ERROR_NOT_SUPPORTED))
	})

	t.Run("performance and memory signals read as the scenario says", func(t *testing.T) {
		g := NewWithT(t)
		d := devices[0]
		g.Expect(d.GetCurrentClocksEventReasons()).To(Equal(uint64(nvml.ClocksThrottleReasonHwThermalSlowdown | nvml.ClocksThrottleReasonHwSlowdown)))
		g.Expect(d.GetCurrentClocksThrottleReasons()).To(Equal(uint64(0x48)), "the pre-535 name answers the same")
		g.Expect(d.GetClockInfo(nvml.CLOCK_SM)).To(Equal(uint32(1200)))
		g.Expect(d.GetMaxClockInfo(nvml.CLOCK_SM)).To(Equal(uint32(1980)))
		// HW thermal slowdown has been active since Init: the thermal
		// policy's violation time is the time since then, power's none.
		before := time.Since(initAt)
		thermal, ret := d.GetViolationStatus(nvml.PERF_POLICY_THERMAL)
		after := time.Since(initAt)
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		g.Expect(time.Duration(thermal.ViolationTime)).To(BeNumerically("~", (before+after)/2, 50*time.Millisecond))
		g.Expect(time.UnixMicro(int64(thermal.ReferenceTime))).To(BeTemporally("~", time.Now(), time.Second))
		power, ret := d.GetViolationStatus(nvml.PERF_POLICY_POWER)
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		g.Expect(power.ViolationTime).To(BeZero())
		g.Expect(d.GetCurrPcieLinkGeneration()).To(Equal(4))
		g.Expect(d.GetCurrPcieLinkWidth()).To(Equal(8))
		g.Expect(d.GetMaxPcieLinkGeneration()).To(Equal(5))
		g.Expect(d.GetMaxPcieLinkWidth()).To(Equal(16))
		g.Expect(d.GetGpuMaxPcieLinkGeneration()).To(Equal(5))
		replays, ret := d.GetPcieReplayCounter()
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		g.Expect(replays).To(BeNumerically("~", 1000*time.Since(initAt).Seconds(), 100))
		g.Expect(d.GetUtilizationRates()).To(Equal(nvml.Utilization{Gpu: 95, Memory: 30}))
		corr, unc, pending, failed, ret := d.GetRemappedRows()
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		g.Expect([]any{corr, unc, pending, failed}).To(Equal([]any{1, 2, true, false}))
		g.Expect(d.GetRetiredPagesPendingStatus()).To(Equal(nvml.FEATURE_DISABLED))
		g.Expect(d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)).To(Equal(uint64(5)))
		g.Expect(d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC)).To(Equal(uint64(0)))
		g.Expect(d.GetTemperature(nvml.TEMPERATURE_GPU)).To(Equal(uint32(87)))
		g.Expect(d.GetTemperatureThreshold(nvml.TEMPERATURE_THRESHOLD_SLOWDOWN)).To(Equal(uint32(89)))
		g.Expect(d.GetTemperatureThreshold(nvml.TEMPERATURE_THRESHOLD_SHUTDOWN)).To(Equal(uint32(95)))

		// Link 2 runs at half speed; the others at the default, whether
		// asked through the scoped field or the legacy per-link ones.
		values := []nvml.FieldValue{
			{FieldId: nvml.FI_DEV_NVLINK_GET_SPEED, ScopeId: 2},
			{FieldId: nvml.FI_DEV_NVLINK_GET_SPEED, ScopeId: 17},
			{FieldId: nvml.FI_DEV_NVLINK_SPEED_MBPS_L2},
			{FieldId: nvml.FI_DEV_NVLINK_SPEED_MBPS_L6},
			{FieldId: nvml.FI_DEV_NVLINK_GET_SPEED, ScopeId: 18},
			{FieldId: nvml.FI_DEV_PCIE_REPLAY_COUNTER},
		}
		g.Expect(d.GetFieldValues(values)).To(Equal(nvml.SUCCESS))
		speed := func(v nvml.FieldValue) uint32 {
			g.Expect(v.ValueType).To(Equal(uint32(nvml.VALUE_TYPE_UNSIGNED_INT)))
			return uint32(v.Value[0]) | uint32(v.Value[1])<<8 | uint32(v.Value[2])<<16 | uint32(v.Value[3])<<24
		}
		for i, want := range []uint32{13281, 26562, 13281, 26562} {
			g.Expect(nvml.Return(values[i].NvmlReturn)).To(Equal(nvml.SUCCESS))
			g.Expect(speed(values[i])).To(Equal(want), "field %d", i)
		}
		g.Expect(nvml.Return(values[4].NvmlReturn)).To(Equal(nvml.ERROR_INVALID_ARGUMENT), "link 18 of 18")
		g.Expect(nvml.Return(values[5].NvmlReturn)).To(Equal(nvml.ERROR_NOT_SUPPORTED), "fields the fake does not model")

		// A GPU without a line of a group does not support it.
		d2 := devices[2]
		_, ret = d2.GetCurrentClocksEventReasons()
		g.Expect(ret).To(Equal(nvml.ERROR_NOT_SUPPORTED))
		_, ret = d2.GetViolationStatus(nvml.PERF_POLICY_THERMAL)
		g.Expect(ret).To(Equal(nvml.ERROR_NOT_SUPPORTED))
		_, ret = d2.GetCurrPcieLinkGeneration()
		g.Expect(ret).To(Equal(nvml.ERROR_NOT_SUPPORTED))
		_, ret = d2.GetPcieReplayCounter()
		g.Expect(ret).To(Equal(nvml.ERROR_NOT_SUPPORTED))
		_, _, _, _, ret = d2.GetRemappedRows()
		g.Expect(ret).To(Equal(nvml.ERROR_NOT_SUPPORTED))
		_, ret = d2.GetTemperature(nvml.TEMPERATURE_GPU)
		g.Expect(ret).To(Equal(nvml.ERROR_NOT_SUPPORTED))
		_, ret = d2.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
		g.Expect(ret).To(Equal(nvml.ERROR_NOT_SUPPORTED))
		values = []nvml.FieldValue{{FieldId: nvml.FI_DEV_NVLINK_GET_SPEED, ScopeId: 0}}
		g.Expect(d2.GetFieldValues(values)).To(Equal(nvml.SUCCESS))
		g.Expect(nvml.Return(values[0].NvmlReturn)).To(Equal(nvml.ERROR_NOT_SUPPORTED))
	})

	t.Run("lines appended while running take effect", func(t *testing.T) {
		g := NewWithT(t)
		now := At(time.Now())
		appendFile(t, scenario, "\nxid device=1 code=31 at="+now+
			"\nnot a directive\nfabric device=1 state=completed health=limited_capacity at="+now+
			"\ndevice uuid=GPU-late # devices are fixed at Init\n")
		data, ret := set.Wait(3000)
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		g.Expect(data.EventData).To(Equal(uint64(31)))
		g.Expect(data.Device.GetUUID()).To(Equal(uuid1))
		g.Expect(n.DeviceGetCount()).To(Equal(3))
		v3, ret := devices[1].GetGpuFabricInfoV().V3()
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		g.Expect(v3.HealthSummary).To(Equal(uint8(nvml.GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY)))

		// A line without its newline yet waits for it.
		appendFile(t, scenario, "xid device=0 code=43 at="+At(time.Now()))
		_, ret = set.Wait(300)
		g.Expect(ret).To(Equal(nvml.ERROR_TIMEOUT))
		appendFile(t, scenario, "\n")
		data, ret = set.Wait(3000)
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		g.Expect(data.EventData).To(Equal(uint64(43)))
	})

	t.Run("a lost GPU fails the wait and its own calls", func(t *testing.T) {
		g := NewWithT(t)
		appendFile(t, scenario, "lost device=2 at="+At(time.Now())+"\n")
		_, ret := set.Wait(3000)
		g.Expect(ret).To(Equal(nvml.ERROR_GPU_IS_LOST))
		_, ret = devices[2].GetUUID()
		g.Expect(ret).To(Equal(nvml.ERROR_GPU_IS_LOST))
		_, ret = n.DeviceGetHandleByIndex(2)
		g.Expect(ret).To(Equal(nvml.ERROR_GPU_IS_LOST))
		g.Expect(devices[0].GetUUID()).To(Equal(uuid0))

		// A set without the lost GPU still waits normally.
		other, ret := n.EventSetCreate()
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		g.Expect(devices[0].RegisterEvents(nvml.EventTypeXidCriticalError, other)).To(Equal(nvml.SUCCESS))
		_, ret = other.Wait(50)
		g.Expect(ret).To(Equal(nvml.ERROR_TIMEOUT))
		g.Expect(other.Free()).To(Equal(nvml.SUCCESS))
	})

	g.Expect(set.Free()).To(Equal(nvml.SUCCESS))
	g.Expect(n.Shutdown()).To(Equal(nvml.SUCCESS))

	t.Run("Init after Shutdown reads the scenario afresh", func(t *testing.T) {
		g := NewWithT(t)
		writeFile(t, scenario, "device uuid=GPU-only\nxid device=0 code=79 at=1s\n")
		g.Expect(n.Init()).To(Equal(nvml.SUCCESS))
		defer func() { g.Expect(n.Shutdown()).To(Equal(nvml.SUCCESS)) }()
		g.Expect(n.DeviceGetCount()).To(Equal(1))
		d, ret := n.DeviceGetHandleByIndex(0)
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		g.Expect(d.GetUUID()).To(Equal("GPU-only"))
		set, ret := n.EventSetCreate()
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		g.Expect(d.RegisterEvents(nvml.EventTypeXidCriticalError, set)).To(Equal(nvml.SUCCESS))
		data, ret := set.Wait(3000)
		g.Expect(ret).To(Equal(nvml.SUCCESS))
		g.Expect(data.EventData).To(Equal(uint64(79)))
		g.Expect(set.Free()).To(Equal(nvml.SUCCESS))
	})

	t.Run("Init fails without a readable scenario", func(t *testing.T) {
		g := NewWithT(t)
		t.Setenv(ScenarioEnv, filepath.Join(dir, "missing"))
		// A library of its own: go-nvml keeps it loaded after a failed Init.
		g.Expect(nvml.New(nvml.WithLibraryPath(lib)).Init()).To(Equal(nvml.ERROR_UNKNOWN))
		t.Setenv(ScenarioEnv, "")
		g.Expect(nvml.New(nvml.WithLibraryPath(lib)).Init()).To(Equal(nvml.ERROR_UNKNOWN))
	})
}

// cString reads a NUL-terminated C string out of a go-nvml char array.
func cString(b []int8) string {
	s := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func appendFile(t *testing.T, path, content string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
}
