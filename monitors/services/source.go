package services

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// Defaults for the Source fields left zero.
const (
	// DefaultProcRoot is where the agent's DaemonSet mounts the host's
	// /proc. A procfs mount shows the PID namespace it was mounted in, so
	// the host's /proc lists the host's processes, those of every
	// container included (Fabric Manager in the GPU Operator's driver
	// container, IMEX in the DRA driver's ComputeDomain daemon pods).
	DefaultProcRoot = "/host/proc"
	// DefaultBinRoot is where the DaemonSet mounts the host's /usr/bin,
	// where NVIDIA's packages install the daemons.
	DefaultBinRoot = "/host/usr/bin"
	// DefaultSysRoot is sysfs; its PCI tree is the host's in a container.
	DefaultSysRoot = "/sys"
	// DefaultIMEXNodesConfig is a host-managed IMEX daemon's list of the
	// domain's nodes, seen through a mount of the host's /etc/nvidia-imex.
	// The nvidia-imex package installs config.cfg but not this file: an
	// administrator (or a provisioning tool) writes it to run IMEX on the
	// host, so its presence says the host service is meant to run.
	DefaultIMEXNodesConfig = "/host/etc/nvidia-imex/nodes_config.cfg"
	// DefaultInterval is how often /proc is scanned. Listing /proc and
	// reading the comm file of each process costs a few milliseconds; a
	// service that is down stays down for much longer than 30 s.
	DefaultInterval = 30 * time.Second
	// DefaultWindow is how far back starts are counted.
	DefaultWindow = 10 * time.Minute
	// DefaultMaxRestarts is how many starts within Window make a service
	// restarting: systemd restarting a crashed daemon once is recovery,
	// three times in ten minutes is a daemon that cannot stay up.
	DefaultMaxRestarts = 3
	// DefaultGrace is how long a service must be seen not running before
	// it is reported: systemd restarts a daemon in seconds, and a scan that
	// falls between stop and start is not an outage. Two scans at the
	// default Interval.
	DefaultGrace = time.Minute
)

// Unit names of the services: the systemd units NVIDIA's packages install,
// and the component ids of the services' findings.
const (
	// FabricManager is Fabric Manager (daemon nv-fabricmanager).
	FabricManager = "nvidia-fabricmanager"
	// Persistenced is the persistence daemon (nvidia-persistenced).
	Persistenced = "nvidia-persistenced"
	// IMEX is a host-managed IMEX daemon (nvidia-imex).
	IMEX = "nvidia-imex"
)

// Codes of the services' findings.
const (
	// CodeFabricManagerNotRunning is Fabric Manager not running on an
	// NVSwitch system (Check Fabric).
	CodeFabricManagerNotRunning = "FabricManagerNotRunning"
	// CodeFabricManagerRestarting is Fabric Manager started MaxRestarts
	// times or more within Window on an NVSwitch system (Check Fabric).
	CodeFabricManagerRestarting = "FabricManagerRestarting"
	// CodeNotRunning is another service not running (Check Service).
	CodeNotRunning = "NotRunning"
	// CodeRestarting is another service restarting (Check Service).
	CodeRestarting = "Restarting"
)

// service is one of the services the source looks for.
type service struct {
	// unit is the systemd unit, binary the daemon's file name in /usr/bin.
	unit, binary string
}

// known are the services, in the order Status lists them. The binary names
// are those of NVIDIA's packages: /usr/bin/nv-fabricmanager (the
// nvidia-fabricmanager unit's ExecStart), /usr/bin/nvidia-persistenced and
// /usr/bin/nvidia-imex.
var known = [...]service{
	{unit: FabricManager, binary: "nv-fabricmanager"},
	{unit: Persistenced, binary: "nvidia-persistenced"},
	{unit: IMEX, binary: "nvidia-imex"},
}

// ServiceStatus is what the last scan found of one service.
type ServiceStatus struct {
	// Name is the service's unit name (FabricManager, Persistenced, IMEX).
	Name string
	// Installed is true when the daemon's binary is under BinRoot or a
	// process of it runs (a daemon of a driver container is not under the
	// host's /usr/bin).
	Installed bool
	// Required is true when the source expects the service to run:
	// Fabric Manager on an NVSwitch system, the persistence daemon when
	// installed, IMEX when installed and configured (IMEXNodesConfig).
	Required bool
	// Running is true when a process of the service runs.
	Running bool
	// PID is the service's oldest process (the daemon; later ones are its
	// children); 0 when it does not run.
	PID int
	// Starts is how many times the service started within Window, as seen
	// by the scans: a new process, or one after none.
	Starts int
	// Since is when the process started (from its start time and the
	// host's boot time; the scan's time when those cannot be read) while
	// it runs, or when a scan first saw it not running.
	Since time.Time
}

// Source reports, each Interval, whether NVIDIA's host services run on the
// node. It reads the host's /proc (the comm and stat files of each
// process), the host's /usr/bin (is the daemon installed) and sysfs's PCI
// tree (is this an NVSwitch system); not systemd, whose D-Bus API would
// need the host's system bus in the container. What the unit is called or
// whether it is enabled does not matter: a daemon that runs is what makes
// the GPUs usable.
//
// The services and their findings (Component kind Service, id the unit):
//
//   - Fabric Manager (nv-fabricmanager), on an NVSwitch system (NVSwitches
//     on the PCI bus, in any scan since Run started), whether its package
//     is installed or not. Not running for Grace: Check Fabric, Code
//     FabricManagerNotRunning; started MaxRestarts times within Window:
//     Code FabricManagerRestarting. Both Severity Fatal, Action RebootNode.
//     NVIDIA's Fabric Manager user guide
//     (https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html,
//     "NVSwitch and NVLink Initialization" and the
//     ABORT_CUDA_JOBS_ON_FM_EXIT option): until Fabric Manager has
//     configured the fabric, CUDA initialization fails with
//     cudaErrorSystemNotReady; when it exits, new CUDA jobs fail to launch
//     (and before H100, running ones are aborted too, by default). So the
//     node's GPUs are unusable. Bringing it back is not a restart of the
//     unit: on H100 and later systems the guide's procedure is to stop
//     every CUDA application and GPU service, stop Fabric Manager, reset
//     all GPUs (nvidia-smi -r) and start Fabric Manager again. The agent
//     cannot run the host's systemctl, and a reset of one GPU (ResetGPU)
//     is not that procedure; a drain and a reboot are, in that order, with
//     Fabric Manager started at boot. A Fabric Manager that keeps
//     restarting breaks the fabric each time it goes.
//   - The persistence daemon (nvidia-persistenced), when installed. Not
//     running: Check Service, Code NotRunning; restarting: Code
//     Restarting; Severity Degraded, Action None. It keeps the driver's
//     state of each GPU loaded while no client has the GPU open
//     (https://docs.nvidia.com/deploy/driver-persistence/persistence-daemon.html);
//     without it the driver tears a GPU's state down when its last client
//     closes it and sets it up again for the next, which slows every CUDA
//     start and nvidia-smi, but the GPUs work.
//   - A host-managed IMEX daemon (nvidia-imex), when installed and
//     configured (IMEXNodesConfig exists). Same findings as the
//     persistence daemon. Multi-node NVLink memory sharing through this
//     node fails without it; the imex source judges the daemon's state
//     itself. With NVIDIA's DRA driver the IMEX daemon runs in a
//     ComputeDomain pod (whose process counts as running) and NVIDIA's
//     instructions disable and mask the host unit: a node set up that way
//     should not keep a nodes_config.cfg at IMEXNodesConfig.
//
// A condition is reported when it starts, again every Repeat while it
// holds, and as Resolved when it ends, through monitors.Tracker. A process
// counts as a start when its pid or start time differs from the last
// scan's, or when the last scan saw none; the first scan counts nothing,
// since it did not see the service start. Starts are seen only once per
// scan: a daemon that dies and comes back between two scans with the same
// pid is not seen to restart (pids are handed out in increasing order, so
// that takes a wrapped pid space).
//
// Not covered: NVSwitch systems whose switches are not PCI devices (HGX
// B200/B300 and B100: fourth-generation NVSwitches sit behind ConnectX-7
// bridges) are not recognised, so a missing Fabric Manager there is not
// this source's finding; the nvml source's fabric check sees GPUs whose
// fabric registration never completes. Fabric Manager's NVLink Subnet
// Manager (nvlsm) on those systems is not looked for either.
type Source struct {
	// ProcRoot is the host's /proc; empty means DefaultProcRoot.
	ProcRoot string
	// BinRoot is the host's /usr/bin; empty means DefaultBinRoot.
	BinRoot string
	// SysRoot is sysfs; empty means DefaultSysRoot.
	SysRoot string
	// IMEXNodesConfig is the host-managed IMEX daemon's nodes file; empty
	// means DefaultIMEXNodesConfig.
	IMEXNodesConfig string
	// Interval is the time between scans; zero means DefaultInterval.
	Interval time.Duration
	// Window is how far back starts are counted; zero means DefaultWindow.
	Window time.Duration
	// MaxRestarts is how many starts within Window make a service
	// restarting; zero means DefaultMaxRestarts.
	MaxRestarts int
	// Grace is how long a required service must be seen not running
	// before it is reported; zero means DefaultGrace, negative none.
	Grace time.Duration
	// Repeat is how often a condition that holds is reported again; zero
	// means monitors.DefaultRepeat.
	Repeat time.Duration
	// Clock gives the scans' times and ticks; nil means the real clock.
	Clock clock.WithTicker

	mu     sync.Mutex
	status []ServiceStatus
	pci    PCI
}

var _ monitors.Source = &Source{}

// Name returns "services".
func (s *Source) Name() string { return string(gpuhealthv1alpha1.SourceServices) }

// Status returns what the last scan found of each service, in a fixed
// order (FabricManager, Persistenced, IMEX); nil before the first scan. It
// is safe to call while Run runs.
func (s *Source) Status() []ServiceStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.status)
}

// Devices returns the NVIDIA GPUs and NVSwitches the last scan saw on the
// PCI bus (empty when sysfs could not be read). It is safe to call while
// Run runs.
func (s *Source) Devices() PCI {
	s.mu.Lock()
	defer s.mu.Unlock()
	return PCI{GPUs: slices.Clone(s.pci.GPUs), NVSwitches: slices.Clone(s.pci.NVSwitches)}
}

// Run scans until ctx is done. It returns an error wrapping
// monitors.ErrUnavailable when the first scan cannot read ProcRoot; a later
// scan that cannot is logged and changes nothing, so open findings stay
// open. When ctx is done it resolves nothing: the agent is stopping, not
// the condition.
func (s *Source) Run(ctx context.Context, report monitors.Reporter) error {
	sc := s.newScanner(ctrllog.FromContext(ctx).WithValues("source", s.Name()))
	if err := sc.scan(report); err != nil {
		return sc.unavailable(err)
	}
	monitors.Every(ctx, sc.clock, sc.interval, func() {
		if err := sc.scan(report); err != nil {
			sc.log.Error(err, "Reading the host's processes failed; skipping this scan", "procRoot", sc.procRoot)
		}
	})
	return nil
}

// scanner is the state of one Run.
type scanner struct {
	src   *Source
	log   logr.Logger
	clock clock.WithTicker

	procRoot, binRoot, sysRoot, imexConfig string
	interval, window, grace                time.Duration
	maxRestarts                            int

	tracker monitors.Tracker
	states  [len(known)]serviceState
	// nvswitches is the number of NVSwitches the last scan that saw any
	// saw; nonzero makes the node an NVSwitch system for the rest of the
	// run, so that a switch that falls off the bus does not make Fabric
	// Manager optional.
	nvswitches int
	// pciErr is the last sysfs error logged, so that it is logged once.
	pciErr string
	// boot is the host's boot time; zero until read.
	boot time.Time
}

// serviceState is what the scans saw of one service.
type serviceState struct {
	svc service
	// seen is true after the first scan.
	seen    bool
	running bool
	// main is the service's oldest process when it runs.
	main proc
	// since is ServiceStatus.Since.
	since time.Time
	// starts are the times of the scans that saw a start, within window.
	starts []time.Time
}

func (s *Source) newScanner(log logr.Logger) *scanner {
	sc := &scanner{
		src:         s,
		log:         log,
		clock:       s.Clock,
		procRoot:    cmp.Or(s.ProcRoot, DefaultProcRoot),
		binRoot:     cmp.Or(s.BinRoot, DefaultBinRoot),
		sysRoot:     cmp.Or(s.SysRoot, DefaultSysRoot),
		imexConfig:  cmp.Or(s.IMEXNodesConfig, DefaultIMEXNodesConfig),
		interval:    monitors.PositiveOr(s.Interval, DefaultInterval),
		window:      monitors.PositiveOr(s.Window, DefaultWindow),
		grace:       s.Grace,
		maxRestarts: s.MaxRestarts,
		tracker:     monitors.Tracker{Repeat: s.Repeat},
	}
	if sc.clock == nil {
		sc.clock = clock.RealClock{}
	}
	switch {
	case sc.grace == 0:
		sc.grace = DefaultGrace
	case sc.grace < 0:
		sc.grace = 0
	}
	if sc.maxRestarts <= 0 {
		sc.maxRestarts = DefaultMaxRestarts
	}
	for i, svc := range known {
		sc.states[i].svc = svc
	}
	return sc
}

// unavailable explains a first scan that could not read ProcRoot.
func (sc *scanner) unavailable(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return monitors.Unavailable("host /proc not mounted at %s: %v", sc.procRoot, err)
	case errors.Is(err, errNoProcesses):
		return monitors.Unavailable("host /proc not mounted at %s: it lists no processes", sc.procRoot)
	default:
		return monitors.Unavailable("reading the host's /proc at %s: %v", sc.procRoot, err)
	}
}

// scan reads the processes and the PCI bus once, reports what changed and
// publishes the status. It returns an error, and changes nothing, when
// ProcRoot cannot be read.
func (sc *scanner) scan(report monitors.Reporter) error {
	now := sc.clock.Now()
	comms := make(map[string]bool, len(known))
	for _, svc := range known {
		comms[commOf(svc.binary)] = true
	}
	procs, err := scanProcs(sc.procRoot, comms)
	if err != nil {
		return fmt.Errorf("scanning %s: %w", sc.procRoot, err)
	}
	if sc.boot.IsZero() {
		if boot, err := bootTime(sc.procRoot); err == nil {
			sc.boot = boot
		}
	}
	pci, err := ScanPCI(sc.sysRoot)
	if err != nil {
		if msg := err.Error(); msg != sc.pciErr {
			sc.log.Error(err, "Reading the PCI bus failed; Fabric Manager is judged from earlier scans only", "sysRoot", sc.sysRoot)
			sc.pciErr = msg
		}
	} else {
		sc.pciErr = ""
	}
	if n := len(pci.NVSwitches); n > 0 {
		if sc.nvswitches == 0 {
			sc.log.Info("NVSwitch system: Fabric Manager must run", "nvswitches", n)
		}
		sc.nvswitches = n
	}
	statuses := make([]ServiceStatus, 0, len(known))
	for i := range sc.states {
		st := &sc.states[i]
		statuses = append(statuses, sc.observe(now, st, procs[commOf(st.svc.binary)], report))
	}
	sc.src.mu.Lock()
	sc.src.status, sc.src.pci = statuses, pci
	sc.src.mu.Unlock()
	return nil
}

// observe updates one service's state from the processes found of it,
// raises or resolves its conditions and returns its status.
func (sc *scanner) observe(now time.Time, st *serviceState, procs []proc, report monitors.Reporter) ServiceStatus {
	svc := st.svc
	running := len(procs) > 0
	var main proc
	if running {
		main = slices.MinFunc(procs, func(a, b proc) int {
			return cmp.Or(cmp.Compare(a.start, b.start), cmp.Compare(a.pid, b.pid))
		})
	}
	changed := !st.seen || running != st.running || main != st.main
	if running && st.seen && changed {
		st.starts = append(st.starts, now)
		sc.log.Info("Service started", "service", svc.unit, "pid", main.pid)
	}
	if !running && st.seen && st.running {
		sc.log.Info("Service stopped", "service", svc.unit, "pid", st.main.pid)
	}
	st.starts = slices.DeleteFunc(st.starts, func(t time.Time) bool { return now.Sub(t) >= sc.window })
	if changed {
		st.since = now
		if t, ok := startedAt(sc.boot, main.start); running && ok {
			st.since = t
		}
	}
	st.seen, st.running, st.main = true, running, main

	binary := filepath.Join(sc.binRoot, svc.binary)
	hasBinary := isFile(binary)
	installed := hasBinary || running
	var required bool
	var why string // what makes the service required, for messages
	switch svc.unit {
	case FabricManager:
		required = sc.nvswitches > 0
		why = fmt.Sprintf("%d NVSwitches on the PCI bus", sc.nvswitches)
	case Persistenced:
		required = installed
		why = binary + " is installed"
	case IMEX:
		required = installed && isFile(sc.imexConfig)
		why = fmt.Sprintf("%s is installed and %s configures it", binary, sc.imexConfig)
	}

	down := required && !running && now.Sub(st.since) >= sc.grace
	flapping := required && len(st.starts) >= sc.maxRestarts
	notRunning, restarting := sc.findings(svc)
	notRunning.Message = fmt.Sprintf("no %s process in %s for %s; %s", svc.binary, sc.procRoot, now.Sub(st.since).Round(time.Second), why)
	restarting.Message = fmt.Sprintf("%s started %d times within %s, %d or more is restarting; %s", svc.binary, len(st.starts), sc.window, sc.maxRestarts, why)
	sc.tracker.Set(now, notRunning, down, report)
	sc.tracker.Set(now, restarting, flapping, report)

	status := ServiceStatus{
		Name:      svc.unit,
		Installed: installed,
		Required:  required,
		Running:   running,
		Starts:    len(st.starts),
		Since:     st.since,
	}
	if running {
		status.PID = main.pid
	}
	return status
}

// findings are the not-running and restarting findings of a service,
// without their messages.
func (sc *scanner) findings(svc service) (notRunning, restarting monitors.Finding) {
	f := monitors.Finding{
		Source:    gpuhealthv1alpha1.SourceServices,
		Check:     gpuhealthv1alpha1.CheckService,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentService, ID: svc.unit},
		Severity:  gpuhealthv1alpha1.SeverityDegraded,
		Action:    gpuhealthv1alpha1.ActionNone,
	}
	notRunning, restarting = f, f
	notRunning.Code, restarting.Code = CodeNotRunning, CodeRestarting
	if svc.unit == FabricManager {
		for _, g := range []*monitors.Finding{&notRunning, &restarting} {
			g.Check, g.Severity, g.Action = gpuhealthv1alpha1.CheckFabric, gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode
		}
		notRunning.Code, restarting.Code = CodeFabricManagerNotRunning, CodeFabricManagerRestarting
	}
	return notRunning, restarting
}

// isFile reports whether path is a file (following symbolic links).
func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir()
}
