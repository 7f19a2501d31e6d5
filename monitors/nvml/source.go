package nvml

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
	"github.com/gpuhealth/gpuhealth/monitors/slowgpu"
)

// Counter is an NVLink error counter the source judges.
type Counter string

// The NVLink data-link error counters (nvmlDeviceGetNvLinkErrorCounter).
const (
	CounterReplay   Counter = "REPLAY"
	CounterRecovery Counter = "RECOVERY"
	CounterCRCFlit  Counter = "CRC_FLIT"
	CounterCRCData  Counter = "CRC_DATA"
)

var nvmlCounters = map[Counter]gonvml.NvLinkErrorCounter{
	CounterReplay:   gonvml.NVLINK_ERROR_DL_REPLAY,
	CounterRecovery: gonvml.NVLINK_ERROR_DL_RECOVERY,
	CounterCRCFlit:  gonvml.NVLINK_ERROR_DL_CRC_FLIT,
	CounterCRCData:  gonvml.NVLINK_ERROR_DL_CRC_DATA,
}

// counterOrder fixes the order counters are read in.
var counterOrder = []Counter{CounterCRCFlit, CounterCRCData, CounterReplay, CounterRecovery}

// DefaultThresholds are the error rates per second, over Window, above which
// an NVLink is reported Degraded. They are this project's choice, not
// NVIDIA's: CRC errors are retried by the link and a few are normal, so the
// CRC thresholds are high; a replay means a retried transfer; a recovery
// means the link retrained, so six a minute is already bad.
var DefaultThresholds = map[Counter]float64{
	CounterCRCFlit:  100,
	CounterCRCData:  100,
	CounterReplay:   10,
	CounterRecovery: 0.1,
}

// Defaults for Source.
const (
	DefaultPollInterval = 10 * time.Second
	DefaultWindow       = time.Minute
	// DefaultFabricGrace is how long a GPU's fabric may stay NOT_STARTED or
	// IN_PROGRESS after the agent starts before that is a finding: fabric
	// training after a boot takes minutes. A fabric that was COMPLETED and
	// falls back is a finding at once.
	DefaultFabricGrace = 10 * time.Minute
	// waitTimeout is how long one event-set wait blocks, which bounds how
	// late the source notices that it should stop.
	waitTimeout = 1000
	// maxWaitErrors is how many unexpected wait errors in a row kill the
	// source (the health check then fails and the kubelet restarts it).
	maxWaitErrors = 30
)

// Source is the NVML source. The zero value works with the real library;
// set Library to use another implementation of go-nvml's interface, or
// LibraryPath to load another library (the tests load the fake one).
type Source struct {
	// Library is the NVML library; nil means gonvml.New with LibraryPath.
	Library gonvml.Interface
	// LibraryPath is where libnvidia-ml.so.1 is; empty means the dynamic
	// loader's search path.
	LibraryPath string
	// PollInterval is how often NVLink counters and state and the fabric
	// are read (DefaultPollInterval when zero).
	PollInterval time.Duration
	// Window is the span NVLink error rates are judged over (DefaultWindow
	// when zero).
	Window time.Duration
	// Thresholds are the NVLink error rates per second above which a link
	// is Degraded; a missing counter uses DefaultThresholds, a negative
	// threshold turns the counter off.
	Thresholds map[Counter]float64
	// FabricGrace is DefaultFabricGrace when zero.
	FabricGrace time.Duration
	// Repeat is how often a condition that still holds is reported again
	// (monitors.DefaultRepeat when zero).
	Repeat time.Duration
	// Performance configures the slow-GPU checks.
	Performance slowgpu.Config
	// PCIGPUs lists the PCI addresses of the NVIDIA GPUs on the PCI bus
	// (services.ScanPCI); nil skips the comparison with NVML's list.
	PCIGPUs func() ([]string, error)
	// InventoryInterval is how often the inventory is read again
	// (DefaultInventoryInterval when zero).
	InventoryInterval time.Duration
	// Clock defaults to the real clock.
	Clock clock.WithTicker
	// Log receives the source's logs.
	Log logr.Logger

	mu        sync.Mutex
	devices   []*device
	lost      map[string]bool
	inventory *Inventory
	// symbols are the calls newer than the oldest supported driver that
	// the loaded library has, looked up once at the start.
	symbols symbols
}

// symbols says which optional NVML calls the loaded library exports.
type symbols struct {
	// clocksEventReasons: nvmlDeviceGetCurrentClocksEventReasons (drivers
	// from 535; older ones have only …ClocksThrottleReasons).
	clocksEventReasons bool
	// gpuMaxPcieLinkGeneration: nvmlDeviceGetGpuMaxPcieLinkGeneration.
	gpuMaxPcieLinkGeneration bool
	// gpuFabricInfoV: nvmlDeviceGetGpuFabricInfoV (drivers from 550; R535
	// has only nvmlDeviceGetGpuFabricInfo, without the health summary).
	gpuFabricInfoV bool
}

// lookupSymbols asks the library which optional calls it has; a library that
// cannot say is taken to have them all.
func lookupSymbols(lib gonvml.Interface) symbols {
	has := func(string) bool { return true }
	if ext := extensions(lib); ext != nil {
		has = func(name string) bool { return ext.LookupSymbol(name) == nil }
	}
	return symbols{
		clocksEventReasons:       has(OptionalSymbols[0]),
		gpuMaxPcieLinkGeneration: has(OptionalSymbols[1]),
		gpuFabricInfoV:           has(OptionalSymbols[2]),
	}
}

// device is one GPU as the source knows it.
type device struct {
	handle gonvml.Device
	uuid   string
	pciBus string
	index  int
	links  []int
	rates  map[string]*monitors.Rate // by link and counter
	// fabric is false when the GPU has no fabric to watch.
	fabric          bool
	fabricCompleted bool
	// perf is what the slow-GPU checks remember.
	perf *perfState
}

// Name implements monitors.Source.
func (s *Source) Name() string { return string(gpuhealthv1alpha1.SourceNVML) }

// ResolvePCI maps a PCI bus id (as the kernel log writes it) to the UUID of
// the GPU there, once the source has started.
func (s *Source) ResolvePCI(bus string) (string, bool) {
	want := NormalizeBusID(bus)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.devices {
		if d.pciBus == want {
			return d.uuid, true
		}
	}
	return "", false
}

// NormalizeBusID lowercases a PCI bus id and reduces NVML's 8-digit domain
// (00000000:3B:00.0) to the kernel's 4 digits (0000:3b:00.0).
func NormalizeBusID(bus string) string {
	b := strings.ToLower(strings.TrimSpace(bus))
	if i := strings.IndexByte(b, ':'); i > 4 {
		b = b[i-4:]
	}
	return b
}

// Run implements monitors.Source.
func (s *Source) Run(ctx context.Context, report monitors.Reporter) error {
	lib := s.Library
	if lib == nil {
		var opts []gonvml.LibraryOption
		if s.LibraryPath != "" {
			opts = append(opts, gonvml.WithLibraryPath(s.LibraryPath))
		}
		lib = gonvml.New(opts...)
	}
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		switch ret {
		case gonvml.ERROR_LIBRARY_NOT_FOUND, gonvml.ERROR_DRIVER_NOT_LOADED, gonvml.ERROR_NO_PERMISSION:
			return monitors.Unavailable("initializing NVML: %s (is the NVIDIA driver installed and libnvidia-ml.so.1 visible to the container?)", lib.ErrorString(ret))
		default:
			return fmt.Errorf("initializing NVML: %s", lib.ErrorString(ret))
		}
	}
	defer func() { _ = lib.Shutdown() }()
	defer func() {
		s.mu.Lock()
		s.inventory = nil
		s.mu.Unlock()
	}()
	// go-nvml binds symbols lazily: calling one the driver lacks aborts the
	// process, so calls newer than the oldest supported driver are looked
	// up first.
	s.symbols = lookupSymbols(lib)
	devices, err := s.discover(lib)
	if err != nil {
		return err
	}
	if len(devices) == 0 {
		if pci := s.pciGPUs(); len(pci) > 0 {
			report(gpuMissingFinding(missingFromNVML(pci, nil), 0, len(pci), s.clock().Now()))
		}
		return monitors.Unavailable("NVML reports no GPUs on this node")
	}
	s.mu.Lock()
	s.devices = devices
	s.mu.Unlock()
	// Register for XIDs before announcing the watch: NVML delivers only
	// XIDs raised after registration, so "watching" must mean registered.
	set, registered, err := s.registerEvents(lib)
	if err != nil {
		return err
	}
	defer func() { _ = set.Free() }()
	s.Log.Info("Watching GPUs through NVML", "gpus", len(devices), "xidEvents", registered)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	go func() { errs <- s.watchEvents(ctx, lib, set, registered, report) }()
	go func() { errs <- s.poll(ctx, lib, report) }()
	first := <-errs
	cancel()
	second := <-errs
	if ctx.Err() != nil && first == nil {
		return second
	}
	return first
}

// pciGPUs scans the PCI bus, or returns nil when there is no scanner or
// the scan failed (logged: the comparison is skipped, nothing is judged).
func (s *Source) pciGPUs() []string {
	if s.PCIGPUs == nil {
		return nil
	}
	pci, err := s.PCIGPUs()
	if err != nil {
		s.Log.Info("Cannot list the PCI bus's GPUs; NVML's list is not compared with it", "err", err.Error())
		return nil
	}
	return pci
}

// extensions returns the library's extended interface, or nil when it has
// none (go-nvml's mock panics when asked without an ExtensionsFunc).
func extensions(lib gonvml.Interface) (ext gonvml.ExtendedInterface) {
	defer func() {
		if recover() != nil {
			ext = nil
		}
	}()
	return lib.Extensions()
}

// discover reads every GPU's identity.
func (s *Source) discover(lib gonvml.Interface) ([]*device, error) {
	n, ret := lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("counting GPUs: %s", lib.ErrorString(ret))
	}
	var out []*device
	for i := range n {
		h, ret := lib.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			return nil, fmt.Errorf("getting GPU %d: %s", i, lib.ErrorString(ret))
		}
		uuid, ret := h.GetUUID()
		if ret != gonvml.SUCCESS {
			return nil, fmt.Errorf("reading UUID of GPU %d: %s", i, lib.ErrorString(ret))
		}
		d := &device{handle: h, uuid: uuid, index: i, rates: map[string]*monitors.Rate{}, fabric: true}
		if pci, ret := h.GetPciInfo(); ret == gonvml.SUCCESS {
			d.pciBus = NormalizeBusID(BusID(pci.BusId))
		}
		for l := range gonvml.NVLINK_MAX_LINKS {
			if _, ret := h.GetNvLinkState(l); ret == gonvml.SUCCESS {
				d.links = append(d.links, l)
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// BusID converts NVML's NUL-terminated bus id array to a string.
func BusID(raw [32]int8) string {
	var b strings.Builder
	for _, c := range raw {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	return b.String()
}

// registerEvents creates the event set and registers every GPU that can
// deliver XIDs through it; it returns how many could.
func (s *Source) registerEvents(lib gonvml.Interface) (gonvml.EventSet, int, error) {
	set, ret := lib.EventSetCreate()
	if ret != gonvml.SUCCESS {
		return nil, 0, fmt.Errorf("creating NVML event set: %s", lib.ErrorString(ret))
	}
	registered := 0
	for _, d := range s.devices {
		if ret := d.handle.RegisterEvents(gonvml.EventTypeXidCriticalError, set); ret != gonvml.SUCCESS {
			s.Log.Info("GPU does not deliver XID events through NVML; the kmsg source still sees them", "gpu", d.uuid, "err", lib.ErrorString(ret))
			continue
		}
		registered++
	}
	return set, registered, nil
}

// watchEvents reports XIDs from a registered NVML event set as they happen.
func (s *Source) watchEvents(ctx context.Context, lib gonvml.Interface, set gonvml.EventSet, registered int, report monitors.Reporter) error {
	if registered == 0 {
		<-ctx.Done()
		return nil
	}
	failures := 0
	for ctx.Err() == nil {
		data, ret := set.Wait(waitTimeout)
		switch ret {
		case gonvml.SUCCESS:
			failures = 0
			if data.EventType&gonvml.EventTypeXidCriticalError == 0 {
				continue
			}
			uuid := s.uuidOf(data.Device)
			if uuid == "" {
				s.Log.Info("XID event from an unknown GPU", "xid", data.EventData)
				continue
			}
			report(monitors.Finding{
				Source:    gpuhealthv1alpha1.SourceNVML,
				Check:     gpuhealthv1alpha1.CheckXID,
				Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: uuid},
				Code:      strconv.FormatUint(data.EventData, 10),
				Time:      s.clock().Now(),
			})
		case gonvml.ERROR_TIMEOUT:
			failures = 0
		case gonvml.ERROR_GPU_IS_LOST:
			s.checkLost(report)
			if !s.sleep(ctx, time.Second) {
				return nil
			}
		default:
			failures++
			if failures >= maxWaitErrors {
				return fmt.Errorf("waiting for NVML events: %s, %d times in a row", lib.ErrorString(ret), failures)
			}
			s.Log.Error(errors.New(lib.ErrorString(ret)), "Waiting for NVML events failed; retrying")
			if !s.sleep(ctx, time.Second) {
				return nil
			}
		}
	}
	return nil
}

func (s *Source) uuidOf(h gonvml.Device) string {
	for _, d := range s.devices {
		if d.handle == h {
			return d.uuid
		}
	}
	if h == nil {
		return ""
	}
	if uuid, ret := h.GetUUID(); ret == gonvml.SUCCESS {
		return uuid
	}
	return ""
}

// checkLost finds the GPUs NVML says are lost and reports each once.
func (s *Source) checkLost(report monitors.Reporter) {
	for _, d := range s.devices {
		if _, ret := d.handle.GetUUID(); ret == gonvml.ERROR_GPU_IS_LOST {
			s.markLost(d, report)
		}
	}
}

// markLost reports that a GPU is lost, once per run: a lost GPU does not
// come back without a reset or reboot, which restarts the agent anyway.
func (s *Source) markLost(d *device, report monitors.Reporter) {
	s.mu.Lock()
	if s.lost == nil {
		s.lost = map[string]bool{}
	}
	already := s.lost[d.uuid]
	s.lost[d.uuid] = true
	s.mu.Unlock()
	if already {
		return
	}
	report(monitors.Finding{
		Source:    gpuhealthv1alpha1.SourceNVML,
		Check:     gpuhealthv1alpha1.CheckGPULost,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: d.uuid},
		Code:      "GPU_IS_LOST",
		Message:   fmt.Sprintf("NVML reports GPU %d (%s, PCI %s) lost", d.index, d.uuid, d.pciBus),
		Time:      s.clock().Now(),
	})
}

func (s *Source) isLost(d *device) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lost[d.uuid]
}

func (s *Source) clock() clock.WithTicker {
	if s.Clock == nil {
		return clock.RealClock{}
	}
	return s.Clock
}

// sleep waits d or until ctx is done; false means ctx is done.
func (s *Source) sleep(ctx context.Context, d time.Duration) bool {
	t := s.clock().NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// errLost marks a device that NVML reports lost while polling.
var errLost = errors.New("GPU is lost")
