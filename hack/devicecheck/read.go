package main

import (
	"fmt"
	"strconv"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors/nvml"
	"github.com/gpuhealth/gpuhealth/monitors/slowgpu"
)

// The NVML functions newer than the oldest supported driver that the
// readings call; each is in nvml.OptionalSymbols (a test checks) and is
// called only when the loaded library has it, as the agent does. Every
// other function called here is one the agent calls unconditionally.
const (
	symClocksEventReasons       = "nvmlDeviceGetCurrentClocksEventReasons"
	symGpuMaxPcieLinkGeneration = "nvmlDeviceGetGpuMaxPcieLinkGeneration"
	symGpuFabricInfoV           = "nvmlDeviceGetGpuFabricInfoV"
)

// The checks a reading line names.
const (
	checkDriver       = "driver"
	checkInventory    = "inventory"
	checkFabric       = "fabric"
	checkNVLink       = "nvlink"
	checkNVLinkErrors = "nvlinkErrors"
	checkClocks       = "clocks"
	checkPCIe         = "pcie"
	checkPCIeReplays  = "pcieReplays"
	checkRemappedRows = "remappedRows"
	checkRetiredPages = "retiredPages"
	checkECC          = "ecc"
	checkTemperature  = "temperature"
	checkUtilization  = "utilization"
)

// gpuReaders are the per-GPU readings, in the order they are taken.
var gpuReaders = []struct {
	check string
	read  func(*checker, *device, *probe) any
}{
	{checkInventory, (*checker).readInventory},
	{checkFabric, (*checker).readFabric},
	{checkNVLink, (*checker).readNVLink},
	{checkNVLinkErrors, (*checker).readNVLinkErrors},
	{checkClocks, (*checker).readClocks},
	{checkPCIe, (*checker).readPCIe},
	{checkPCIeReplays, (*checker).readPCIeReplays},
	{checkRemappedRows, (*checker).readRemappedRows},
	{checkRetiredPages, (*checker).readRetiredPages},
	{checkECC, (*checker).readECC},
	{checkTemperature, (*checker).readTemperature},
	{checkUtilization, (*checker).readUtilization},
}

// nvlinkCounters are the NVLink error counters the agent judges, in its
// order.
var nvlinkCounters = []struct {
	name nvml.Counter
	id   gonvml.NvLinkErrorCounter
}{
	{nvml.CounterCRCFlit, gonvml.NVLINK_ERROR_DL_CRC_FLIT},
	{nvml.CounterCRCData, gonvml.NVLINK_ERROR_DL_CRC_DATA},
	{nvml.CounterReplay, gonvml.NVLINK_ERROR_DL_REPLAY},
	{nvml.CounterRecovery, gonvml.NVLINK_ERROR_DL_RECOVERY},
}

// violationPolicies are the violation counters the agent reads.
var violationPolicies = []struct {
	name slowgpu.Policy
	id   gonvml.PerfPolicyType
}{
	{slowgpu.PolicyThermal, gonvml.PERF_POLICY_THERMAL},
	{slowgpu.PolicyReliability, gonvml.PERF_POLICY_RELIABILITY},
	{slowgpu.PolicyPower, gonvml.PERF_POLICY_POWER},
}

// clocksReasonNames are nvml.h's nvmlClocksEventReason* bits, named as the
// fake library's scenario files name them.
var clocksReasonNames = []struct {
	bit  uint64
	name string
}{
	{0x1, "gpu_idle"}, {0x2, "app_clocks"}, {0x4, "sw_power_cap"}, {0x8, "hw_slowdown"},
	{0x10, "sync_boost"}, {0x20, "sw_thermal"}, {0x40, "hw_thermal"}, {0x80, "hw_power_brake"},
	{0x100, "display_clock"}, {0x200, "board_limit"}, {0x400, "reliability"},
}

// device is one GPU as discovered at the start.
type device struct {
	index  int
	uuid   string
	pciBus string
	handle gonvml.Device
	// links are the NVLinks whose state NVML reported at the start.
	links []int
	// legacySpeed is set once the scoped NVLink speed field is found
	// unsupported: the per-link fields of older drivers are read instead.
	legacySpeed bool
}

// checker takes the readings through its own handle on NVML.
type checker struct {
	lib     gonvml.Interface
	times   timings
	symbols map[string]bool
	devices []*device
	// readings and readErrors count the reading lines and the failed calls
	// in them.
	readings, readErrors int
}

// probe collects the failed calls of one reading.
type probe struct {
	c    *checker
	errs map[string]string
}

// call makes one timed NVML call of function name; a failure is recorded
// under name(arg).
func (p *probe) call(name, arg string, f func() gonvml.Return) bool {
	ret := p.c.times.call(name, f)
	if ret == gonvml.SUCCESS {
		return true
	}
	p.fail(name, arg, p.c.lib.ErrorString(ret))
	return false
}

func (p *probe) fail(name, arg, why string) {
	if arg != "" {
		name += "(" + arg + ")"
	}
	if p.errs == nil {
		p.errs = map[string]string{}
	}
	p.errs[name] = why
}

// get makes one call that returns a value, and returns the value or nil.
func get[T any](p *probe, name, arg string, f func() (T, gonvml.Return)) *T {
	var v T
	if !p.call(name, arg, func() (ret gonvml.Return) {
		v, ret = f()
		return ret
	}) {
		return nil
	}
	return &v
}

// lookupSymbols asks the library which of the agent's optional functions
// it exports.
func (c *checker) lookupSymbols() {
	c.symbols = map[string]bool{}
	ext := c.lib.Extensions()
	for _, name := range nvml.OptionalSymbols {
		c.symbols[name] = ext.LookupSymbol(name) == nil
	}
}

// discover lists the GPUs as the agent does; a GPU that cannot be
// identified is left out and reported.
func (c *checker) discover() []error {
	var n int
	if ret := c.times.call("nvmlDeviceGetCount_v2", func() (ret gonvml.Return) {
		n, ret = c.lib.DeviceGetCount()
		return ret
	}); ret != gonvml.SUCCESS {
		return []error{fmt.Errorf("counting GPUs: %s", c.lib.ErrorString(ret))}
	}
	var errs []error
	for i := range n {
		var h gonvml.Device
		if ret := c.times.call("nvmlDeviceGetHandleByIndex_v2", func() (ret gonvml.Return) {
			h, ret = c.lib.DeviceGetHandleByIndex(i)
			return ret
		}); ret != gonvml.SUCCESS {
			errs = append(errs, fmt.Errorf("getting GPU %d: %s", i, c.lib.ErrorString(ret)))
			continue
		}
		d := &device{index: i, handle: h}
		if ret := c.times.call("nvmlDeviceGetUUID", func() (ret gonvml.Return) {
			d.uuid, ret = h.GetUUID()
			return ret
		}); ret != gonvml.SUCCESS {
			errs = append(errs, fmt.Errorf("reading the UUID of GPU %d: %s", i, c.lib.ErrorString(ret)))
			continue
		}
		var pci gonvml.PciInfo
		if c.times.call("nvmlDeviceGetPciInfo_v3", func() (ret gonvml.Return) {
			pci, ret = h.GetPciInfo()
			return ret
		}) == gonvml.SUCCESS {
			d.pciBus = nvml.NormalizeBusID(nvml.BusID(pci.BusId))
		}
		for l := range gonvml.NVLINK_MAX_LINKS {
			if c.times.call("nvmlDeviceGetNvLinkState", func() (ret gonvml.Return) {
				_, ret = h.GetNvLinkState(l)
				return ret
			}) == gonvml.SUCCESS {
				d.links = append(d.links, l)
			}
		}
		c.devices = append(c.devices, d)
	}
	return errs
}

// readAll takes one round of readings and passes each line to emit as it
// is taken.
func (c *checker) readAll(poll int, emit func(readingLine)) {
	emit(c.reading(poll, nil, checkDriver, func(p *probe) any { return c.readDriver(p) }))
	for _, d := range c.devices {
		for _, r := range gpuReaders {
			emit(c.reading(poll, d, r.check, func(p *probe) any { return r.read(c, d, p) }))
		}
	}
}

// reading takes one reading.
func (c *checker) reading(poll int, d *device, check string, read func(*probe) any) readingLine {
	line := readingLine{Kind: kindReading, Time: time.Now(), Poll: poll, Check: check}
	if d != nil {
		index := d.index
		line.GPU, line.UUID = &index, d.uuid
	}
	p := &probe{c: c}
	line.Values = read(p)
	line.Errors = p.errs
	c.readings++
	c.readErrors += len(p.errs)
	return line
}

// driverValues are the driver's versions as the agent's inventory reports
// them, the GPUs NVML listed and which optional functions the library has.
type driverValues struct {
	gpuhealthv1alpha1.DriverInventory
	GPUs            int             `json:"gpus"`
	OptionalSymbols map[string]bool `json:"optionalSymbols"`
}

func (c *checker) readDriver(p *probe) any {
	v := driverValues{GPUs: len(c.devices), OptionalSymbols: c.symbols}
	if s := get(p, "nvmlSystemGetDriverVersion", "", c.lib.SystemGetDriverVersion); s != nil {
		v.Version = *s
	}
	if n := get(p, "nvmlSystemGetCudaDriverVersion", "", c.lib.SystemGetCudaDriverVersion); n != nil && *n > 0 {
		v.CUDAVersion = fmt.Sprintf("%d.%d", *n/1000, *n%1000/10)
	}
	if s := get(p, "nvmlSystemGetNVMLVersion", "", c.lib.SystemGetNVMLVersion); s != nil {
		v.NVMLVersion = *s
	}
	return v
}

// readInventory reads what the agent's inventory reads of one GPU
// (monitors/nvml's readInventory), into the same type.
func (c *checker) readInventory(d *device, p *probe) any {
	h := d.handle
	g := gpuhealthv1alpha1.GPUInventory{Index: int32(d.index), UUID: d.uuid, PCIBusID: d.pciBus}
	if s := get(p, "nvmlDeviceGetName", "", h.GetName); s != nil {
		g.Product = *s
	}
	if s := get(p, "nvmlDeviceGetVbiosVersion", "", h.GetVbiosVersion); s != nil {
		g.VBIOS = *s
	}
	if s := get(p, "nvmlDeviceGetInforomImageVersion", "", h.GetInforomImageVersion); s != nil {
		g.InfoROM = *s
	}
	var ecc gonvml.EnableState
	if p.call("nvmlDeviceGetEccMode", "", func() (ret gonvml.Return) {
		ecc, _, ret = h.GetEccMode()
		return ret
	}) {
		g.ECC = enabled(ecc == gonvml.FEATURE_ENABLED)
	}
	if m := get(p, "nvmlDeviceGetPersistenceMode", "", h.GetPersistenceMode); m != nil {
		g.Persistence = enabled(*m == gonvml.FEATURE_ENABLED)
	}
	var mig int
	if p.call("nvmlDeviceGetMigMode", "", func() (ret gonvml.Return) {
		mig, _, ret = h.GetMigMode()
		return ret
	}) {
		g.MIG = enabled(mig == gonvml.DEVICE_MIG_ENABLE)
	}
	if mw := get(p, "nvmlDeviceGetPowerManagementLimit", "", h.GetPowerManagementLimit); mw != nil {
		g.PowerLimitWatts = int32(*mw / 1000)
	}
	return g
}

func enabled(on bool) string {
	if on {
		return "Enabled"
	}
	return "Disabled"
}

// fabricValues are the GPU's fabric probe state. HealthSummary and
// HealthMask come only from nvmlDeviceGetGpuFabricInfoV (drivers from
// 550); R535 has only nvmlDeviceGetGpuFabricInfo.
type fabricValues struct {
	// Call is the function that was read.
	Call string `json:"call"`
	// State is not_supported, not_started, in_progress or completed.
	State string `json:"state"`
	// Status is the fabric's NVML return code and its string.
	StatusCode  uint32 `json:"statusCode"`
	Status      string `json:"status"`
	CliqueID    uint32 `json:"cliqueId"`
	ClusterUUID string `json:"clusterUuid"`
	// HealthSummary is not_supported, healthy, unhealthy or
	// limited_capacity.
	HealthSummary string  `json:"healthSummary,omitempty"`
	HealthMask    *uint32 `json:"healthMask,omitempty"`
}

// readFabric reads the fabric as the agent does (nvml.Source.fabricInfo).
func (c *checker) readFabric(d *device, p *probe) any {
	var v fabricValues
	var info gonvml.GpuFabricInfo_v3
	if c.symbols[symGpuFabricInfoV] {
		v.Call = symGpuFabricInfoV
		if !p.call(symGpuFabricInfoV, "", func() (ret gonvml.Return) {
			info, ret = d.handle.GetGpuFabricInfoV().V3()
			return ret
		}) {
			return nil
		}
		mask := info.HealthMask
		v.HealthSummary, v.HealthMask = nameOf(healthSummaries, uint64(info.HealthSummary)), &mask
	} else {
		v.Call = "nvmlDeviceGetGpuFabricInfo"
		old := get(p, v.Call, "", d.handle.GetGpuFabricInfo)
		if old == nil {
			return nil
		}
		info = gonvml.GpuFabricInfo_v3{ClusterUuid: old.ClusterUuid, Status: old.Status, CliqueId: old.CliqueId, State: old.State}
	}
	v.State = nameOf(fabricStates, uint64(info.State))
	v.StatusCode, v.Status = info.Status, c.lib.ErrorString(gonvml.Return(info.Status))
	v.CliqueID = info.CliqueId
	v.ClusterUUID = formatUUID(info.ClusterUuid)
	return v
}

var (
	fabricStates    = []string{"not_supported", "not_started", "in_progress", "completed"}
	healthSummaries = []string{"not_supported", "healthy", "unhealthy", "limited_capacity"}
)

// nameOf names an enumeration's value, or writes its number.
func nameOf(names []string, v uint64) string {
	if v < uint64(len(names)) {
		return names[v]
	}
	return strconv.FormatUint(v, 10)
}

func formatUUID(b [16]uint8) string {
	x := fmt.Sprintf("%x", b[:])
	return x[:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:]
}

// nvlinkValues are the state and speed of each NVLink found at the start.
type nvlinkValues struct {
	Links []linkValues `json:"links"`
	Up    int          `json:"up"`
	Down  int          `json:"down"`
	// SpeedField is the field the speeds were read through: NVLINK_GET_SPEED
	// (scoped by link), or the per-link NVLINK_SPEED_MBPS_L<n> of older
	// drivers.
	SpeedField string `json:"speedField,omitempty"`
}

type linkValues struct {
	Link int `json:"link"`
	// State is up or down; absent when it could not be read.
	State string `json:"state,omitempty"`
	// SpeedMBps is read for links that are up.
	SpeedMBps *uint64 `json:"speedMBps,omitempty"`
}

func (c *checker) readNVLink(d *device, p *probe) any {
	v := nvlinkValues{Links: make([]linkValues, 0, len(d.links))}
	var up []int
	for _, l := range d.links {
		lv := linkValues{Link: l}
		if s := get(p, "nvmlDeviceGetNvLinkState", "link="+strconv.Itoa(l), func() (gonvml.EnableState, gonvml.Return) { return d.handle.GetNvLinkState(l) }); s != nil {
			if *s == gonvml.FEATURE_ENABLED {
				lv.State = "up"
				up = append(up, l)
				v.Up++
			} else {
				lv.State = "down"
				v.Down++
			}
		}
		v.Links = append(v.Links, lv)
	}
	if len(up) == 0 {
		return v
	}
	speeds := c.readLinkSpeeds(d, up, p)
	for i := range v.Links {
		if s, ok := speeds[v.Links[i].Link]; ok {
			v.Links[i].SpeedMBps = &s
		}
	}
	if len(speeds) > 0 {
		v.SpeedField = "NVLINK_GET_SPEED"
		if d.legacySpeed {
			v.SpeedField = "NVLINK_SPEED_MBPS_L<n>"
		}
	}
	return v
}

// readLinkSpeeds reads the speed of each link in up, in MB/s, in one call,
// as the agent does (monitors/nvml's readLinkSpeeds).
func (c *checker) readLinkSpeeds(d *device, up []int, p *probe) map[int]uint64 {
	const name = "nvmlDeviceGetFieldValues"
	values := make([]gonvml.FieldValue, 0, len(up))
	for _, l := range up {
		if !d.legacySpeed {
			values = append(values, gonvml.FieldValue{FieldId: gonvml.FI_DEV_NVLINK_GET_SPEED, ScopeId: uint32(l)})
		} else if id, ok := nvml.LegacySpeedField(l); ok {
			values = append(values, gonvml.FieldValue{FieldId: id, ScopeId: uint32(l)})
		}
	}
	if len(values) == 0 {
		return nil
	}
	if !p.call(name, "nvlink speed", func() gonvml.Return { return d.handle.GetFieldValues(values) }) {
		return nil
	}
	speeds := map[int]uint64{}
	unsupported := 0
	for _, v := range values {
		switch ret := gonvml.Return(v.NvmlReturn); ret {
		case gonvml.SUCCESS:
			if x, ok := fieldUint(v); ok {
				speeds[int(v.ScopeId)] = x
			}
		case gonvml.ERROR_NOT_SUPPORTED:
			unsupported++
		default:
			p.fail(name, "nvlink speed, link="+strconv.Itoa(int(v.ScopeId)), c.lib.ErrorString(ret))
		}
	}
	if unsupported == len(values) {
		if !d.legacySpeed {
			d.legacySpeed = true
			return c.readLinkSpeeds(d, up, p)
		}
		p.fail(name, "nvlink speed", c.lib.ErrorString(gonvml.ERROR_NOT_SUPPORTED))
	}
	return speeds
}

// fieldUint decodes an unsigned field value (little-endian, as NVML's
// union is on the platforms it runs on).
func fieldUint(v gonvml.FieldValue) (uint64, bool) {
	n := 0
	switch gonvml.ValueType(v.ValueType) {
	case gonvml.VALUE_TYPE_UNSIGNED_INT:
		n = 4
	case gonvml.VALUE_TYPE_UNSIGNED_LONG, gonvml.VALUE_TYPE_UNSIGNED_LONG_LONG:
		n = 8
	default:
		return 0, false
	}
	var x uint64
	for i := n - 1; i >= 0; i-- {
		x = x<<8 | uint64(v.Value[i])
	}
	return x, true
}

// nvlinkErrorValues are the NVLink data-link error counters of each link
// found at the start.
type nvlinkErrorValues struct {
	Links []linkErrors `json:"links"`
}

type linkErrors struct {
	Link int `json:"link"`
	// Counters are the cumulative counts by counter (CRC_FLIT, CRC_DATA,
	// REPLAY, RECOVERY); one that could not be read is absent.
	Counters map[nvml.Counter]uint64 `json:"counters"`
}

func (c *checker) readNVLinkErrors(d *device, p *probe) any {
	v := nvlinkErrorValues{Links: make([]linkErrors, 0, len(d.links))}
	for _, l := range d.links {
		le := linkErrors{Link: l, Counters: map[nvml.Counter]uint64{}}
		for _, k := range nvlinkCounters {
			arg := "link=" + strconv.Itoa(l) + "," + string(k.name)
			if n := get(p, "nvmlDeviceGetNvLinkErrorCounter", arg, func() (uint64, gonvml.Return) { return d.handle.GetNvLinkErrorCounter(l, k.id) }); n != nil {
				le.Counters[k.name] = *n
			}
		}
		v.Links = append(v.Links, le)
	}
	return v
}

// clocksValues are the clocks event reasons, the SM clock and the
// violation counters.
type clocksValues struct {
	// Call is the function the reasons were read through:
	// …ClocksEventReasons, or …ClocksThrottleReasons before driver 535.
	Call        string   `json:"call"`
	Reasons     *uint64  `json:"reasons,omitempty"`
	ReasonNames []string `json:"reasonNames,omitempty"`
	SMMHz       *uint32  `json:"smMHz,omitempty"`
	SMMaxMHz    *uint32  `json:"smMaxMHz,omitempty"`
	// ViolationNs are the driver's cumulative violation times by policy
	// (thermal, reliability, power), in nanoseconds.
	ViolationNs map[slowgpu.Policy]uint64 `json:"violationNs,omitempty"`
}

func (c *checker) readClocks(d *device, p *probe) any {
	h := d.handle
	v := clocksValues{Call: symClocksEventReasons}
	reasons := h.GetCurrentClocksEventReasons
	if !c.symbols[symClocksEventReasons] {
		v.Call = "nvmlDeviceGetCurrentClocksThrottleReasons" // drivers before 535
		reasons = h.GetCurrentClocksThrottleReasons
	}
	if r := get(p, v.Call, "", reasons); r != nil {
		v.Reasons, v.ReasonNames = r, reasonNames(*r)
	}
	v.SMMHz = get(p, "nvmlDeviceGetClockInfo", "SM", func() (uint32, gonvml.Return) { return h.GetClockInfo(gonvml.CLOCK_SM) })
	v.SMMaxMHz = get(p, "nvmlDeviceGetMaxClockInfo", "SM", func() (uint32, gonvml.Return) { return h.GetMaxClockInfo(gonvml.CLOCK_SM) })
	for _, pol := range violationPolicies {
		var vt gonvml.ViolationTime
		if p.call("nvmlDeviceGetViolationStatus", string(pol.name), func() (ret gonvml.Return) {
			vt, ret = h.GetViolationStatus(pol.id)
			return ret
		}) {
			if v.ViolationNs == nil {
				v.ViolationNs = map[slowgpu.Policy]uint64{}
			}
			v.ViolationNs[pol.name] = vt.ViolationTime
		}
	}
	return v
}

// reasonNames names the set bits of a clocks event reasons mask.
func reasonNames(r uint64) []string {
	var out []string
	for _, n := range clocksReasonNames {
		if r&n.bit != 0 {
			out = append(out, n.name)
			r &^= n.bit
		}
	}
	if r != 0 {
		out = append(out, fmt.Sprintf("%#x", r))
	}
	return out
}

// pcieValues are the PCIe link's current and maximum generation and width.
type pcieValues struct {
	Generation *int `json:"generation,omitempty"`
	Width      *int `json:"width,omitempty"`
	// MaxGeneration is the link's (the GPU's and the slot's) maximum;
	// GPUMaxGeneration the GPU's own, read where the driver has
	// nvmlDeviceGetGpuMaxPcieLinkGeneration.
	MaxGeneration    *int `json:"maxGeneration,omitempty"`
	GPUMaxGeneration *int `json:"gpuMaxGeneration,omitempty"`
	MaxWidth         *int `json:"maxWidth,omitempty"`
}

func (c *checker) readPCIe(d *device, p *probe) any {
	h := d.handle
	v := pcieValues{
		Generation:    get(p, "nvmlDeviceGetCurrPcieLinkGeneration", "", h.GetCurrPcieLinkGeneration),
		Width:         get(p, "nvmlDeviceGetCurrPcieLinkWidth", "", h.GetCurrPcieLinkWidth),
		MaxGeneration: get(p, "nvmlDeviceGetMaxPcieLinkGeneration", "", h.GetMaxPcieLinkGeneration),
		MaxWidth:      get(p, "nvmlDeviceGetMaxPcieLinkWidth", "", h.GetMaxPcieLinkWidth),
	}
	if c.symbols[symGpuMaxPcieLinkGeneration] {
		v.GPUMaxGeneration = get(p, symGpuMaxPcieLinkGeneration, "", h.GetGpuMaxPcieLinkGeneration)
	}
	return v
}

type pcieReplayValues struct {
	// Count is the cumulative PCIe replay counter.
	Count int `json:"count"`
}

func (c *checker) readPCIeReplays(d *device, p *probe) any {
	if n := get(p, "nvmlDeviceGetPcieReplayCounter", "", d.handle.GetPcieReplayCounter); n != nil {
		return pcieReplayValues{Count: *n}
	}
	return nil
}

// remapValues are nvmlDeviceGetRemappedRows' four answers.
type remapValues struct {
	Correctable   int  `json:"correctable"`
	Uncorrectable int  `json:"uncorrectable"`
	Pending       bool `json:"pending"`
	Failed        bool `json:"failed"`
}

func (c *checker) readRemappedRows(d *device, p *probe) any {
	var v remapValues
	if p.call("nvmlDeviceGetRemappedRows", "", func() (ret gonvml.Return) {
		v.Correctable, v.Uncorrectable, v.Pending, v.Failed, ret = d.handle.GetRemappedRows()
		return ret
	}) {
		return v
	}
	return nil
}

type retiredValues struct {
	// Pending: pages are waiting to be retired at the next reset.
	Pending bool `json:"pending"`
}

func (c *checker) readRetiredPages(d *device, p *probe) any {
	if s := get(p, "nvmlDeviceGetRetiredPagesPendingStatus", "", d.handle.GetRetiredPagesPendingStatus); s != nil {
		return retiredValues{Pending: *s == gonvml.FEATURE_ENABLED}
	}
	return nil
}

type eccValues struct {
	// VolatileUncorrected is the uncorrected ECC count since the driver
	// loaded, the one the agent judges.
	VolatileUncorrected uint64 `json:"volatileUncorrected"`
}

func (c *checker) readECC(d *device, p *probe) any {
	if n := get(p, "nvmlDeviceGetTotalEccErrors", "uncorrected,volatile", func() (uint64, gonvml.Return) {
		return d.handle.GetTotalEccErrors(gonvml.MEMORY_ERROR_TYPE_UNCORRECTED, gonvml.VOLATILE_ECC)
	}); n != nil {
		return eccValues{VolatileUncorrected: *n}
	}
	return nil
}

// temperatureValues are the GPU sensor's temperature and slowdown
// threshold, in °C.
type temperatureValues struct {
	GPUC      *uint32 `json:"gpuC,omitempty"`
	SlowdownC *uint32 `json:"slowdownC,omitempty"`
}

func (c *checker) readTemperature(d *device, p *probe) any {
	return temperatureValues{
		GPUC: get(p, "nvmlDeviceGetTemperature", "GPU", func() (uint32, gonvml.Return) {
			return d.handle.GetTemperature(gonvml.TEMPERATURE_GPU)
		}),
		SlowdownC: get(p, "nvmlDeviceGetTemperatureThreshold", "SLOWDOWN", func() (uint32, gonvml.Return) {
			return d.handle.GetTemperatureThreshold(gonvml.TEMPERATURE_THRESHOLD_SLOWDOWN)
		}),
	}
}

// utilizationValues are the GPU's and its memory's utilisation in percent.
type utilizationValues struct {
	GPUPercent    uint32 `json:"gpuPercent"`
	MemoryPercent uint32 `json:"memoryPercent"`
}

func (c *checker) readUtilization(d *device, p *probe) any {
	if u := get(p, "nvmlDeviceGetUtilizationRates", "", d.handle.GetUtilizationRates); u != nil {
		return utilizationValues{GPUPercent: u.Gpu, MemoryPercent: u.Memory}
	}
	return nil
}
