package framework

import (
	"context"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/monitors/fakenvml"
	"github.com/gpuhealth/gpuhealth/monitors/ib/ibfake"
)

// Binaries are the files the suite runs.
type Binaries struct {
	Operator string
	Monitor  string
	// NVMLDir holds the fake libnvidia-ml.so.1.
	FakeNVML string
}

// Build compiles gpuhealth-operator, gpuhealth-monitor and the fake NVML
// library into dir: the two programs in one go build, which shares the
// compile of their common packages and links them side by side, while gcc
// builds the library.
func Build(ctx context.Context, root, dir string) (Binaries, error) {
	b := Binaries{Operator: filepath.Join(dir, "gpuhealth-operator"), Monitor: filepath.Join(dir, "gpuhealth-monitor")}
	type built struct {
		lib string
		err error
	}
	nvml := make(chan built, 1)
	go func() {
		lib, err := fakenvml.Build(dir)
		nvml <- built{lib, err}
	}()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator), "./cmd/gpuhealth-operator", "./cmd/gpuhealth-monitor")
	cmd.Dir = root
	o, err := cmd.CombinedOutput()
	lib := <-nvml
	b.FakeNVML = lib.lib
	if err != nil {
		return b, fmt.Errorf("building gpuhealth-operator and gpuhealth-monitor: %w\n%s", err, tail(o))
	}
	return b, lib.err
}

// Process is one of our binaries running on the host.
type Process struct {
	Name    string
	LogPath string
	// Health is the host:port of its /healthz and /readyz.
	Health string
	// Metrics is the host:port of its /metrics.
	Metrics string
	// Pprof is the host:port of Go's /debug/pprof endpoints; empty when the
	// process serves none.
	Pprof string
	// OnExit, when set before Start or Launch, is called with the process's
	// exit error (nil for status 0) when it exits by itself, not through
	// Stop or Kill.
	OnExit func(error)

	args []string
	env  []string
	bin  string
	// dieWithParent: see OperatorOptions.DieWithParent.
	dieWithParent bool

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	started time.Time
}

// Start runs the process (again, after Stop or Kill) and waits for /readyz.
func (p *Process) Start(ctx context.Context) error {
	if err := p.Launch(); err != nil {
		return err
	}
	return p.WaitReady(ctx, time.Minute)
}

// Launch runs the process (again, after Stop or Kill) without waiting for
// it to be ready.
func (p *Process) Launch() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	log, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = log, log
	if p.dieWithParent {
		setDieWithParent(cmd)
	}
	started := time.Now()
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return fmt.Errorf("starting %s: %w", p.Name, err)
	}
	done := make(chan struct{})
	go func() {
		err := cmd.Wait()
		_ = log.Close()
		// Stop and Kill clear p.cmd before they signal.
		p.mu.Lock()
		byItself := p.cmd == cmd
		p.mu.Unlock()
		close(done)
		if byItself && p.OnExit != nil {
			p.OnExit(err)
		}
	}()
	p.cmd, p.done, p.started = cmd, done, started
	return nil
}

// Started is when the process was last started; zero before the first.
func (p *Process) Started() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started
}

// WaitReady waits until the process's /readyz answers 200, for at most
// timeout.
func (p *Process) WaitReady(ctx context.Context, timeout time.Duration) error {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	// A process that exited will not become ready: say so at once
	// instead of when timeout ends (the operator exits when it cannot
	// reach the apiserver, and a caller restarting it retries sooner).
	var exited error
	err := Poll(ctx, timeout, func() (bool, string) {
		select {
		case <-done:
			exited = fmt.Errorf("%s exited; see %s", p.Name, p.LogPath)
			return true, ""
		default:
		}
		return Ready(p.Health)
	})
	if exited != nil {
		return exited
	}
	return err
}

// Ready asks the /readyz at addr (host:port) once: ready, or why not.
func Ready(addr string) (bool, string) {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return false, err.Error()
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK, resp.Status
}

// Stop sends SIGTERM and waits (SIGKILL after 15 s).
func (p *Process) Stop() { p.signal(syscall.SIGTERM, 15*time.Second) }

// Kill sends SIGKILL: a crash.
func (p *Process) Kill() { p.signal(syscall.SIGKILL, 0) }

func (p *Process) signal(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	if grace > 0 {
		select {
		case <-done:
			return
		case <-time.After(grace):
			_ = cmd.Process.Kill()
		}
	}
	<-done
}

// Pid is the process id, or 0 when it does not run.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the process runs.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// The ports FreeAddr hands out. Listening on port 0 and closing leaves a
// gap before the process binds, and in it the port is anyone's: the kernel
// gives the same ephemeral range (32768–60999 by default) to every port-0
// bind and every outgoing connection, and kwokctl walks down from 32766
// with the same listen-and-close. Two harnesses side by side (the real-node
// tier beside the soak) took each other's ports that way. Below both, a
// port is only taken by another FreeAddr, and a random one of ten thousand,
// never handed out twice by one process, makes that unlikely.
const freePortLow, freePortHigh = 20000, 30000

var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// FreeAddr returns a free 127.0.0.1 port, one this process has not handed
// out before (a stopped process keeps its port for its restart).
func FreeAddr() (string, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 200 {
		port := freePortLow + mathrand.IntN(freePortHigh-freePortLow)
		if handedOut.ports[port] {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		_ = ln.Close()
		handedOut.ports[port] = true
		return addr, nil
	}
	return "", fmt.Errorf("no free port between %d and %d after 200 tries", freePortLow, freePortHigh)
}

func baseEnv() []string {
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "KUBECONFIG=") {
			env = append(env, e)
		}
	}
	return env
}

// Monitor is one node's gpuhealth-monitor with its fake NVML scenario.
type Monitor struct {
	*Process
	Node     string
	Scenario string
	SpoolDir string
	// KernelLog is the kernel log file the monitor reads (MonitorOptions),
	// empty when it reads none.
	KernelLog string
	// SysRoot is the fake sysfs the monitor reads (MonitorOptions PCIGPUs
	// or IB), empty when it reads the machine's.
	SysRoot string

	kmsgMu  sync.Mutex
	kmsgSeq int
}

// MonitorOptions are a monitor's optional settings.
type MonitorOptions struct {
	// KernelLog adds the kmsg source, reading a file in the node's folder
	// that InjectKernelXIDs appends the driver's records to.
	KernelLog bool
	// PCIGPUs, when set, are the NVIDIA GPUs of a fake sysfs in the node's
	// folder that the monitor reads the PCI bus from (else the machine's
	// /sys, which has none).
	PCIGPUs []string
	// IB, when set, are the RDMA adapters of a fake sysfs in the node's
	// folder that the monitor's ib source reads (ibfake.Write); a test
	// changes their ports under Monitor.SysRoot.
	IB []ibfake.HCA
}

// NewMonitor prepares the monitor for node: it finds the monitor
// DaemonSet's pod on that node (kwok runs it as a fake pod), gets a token
// bound to that pod — so the own-node admission policy applies for real —
// and writes the node's scenario.
func NewMonitor(ctx context.Context, c *Cluster, b Binaries, dir, node, scenario string) (*Monitor, error) {
	return NewMonitorWith(ctx, c, b, dir, node, scenario, MonitorOptions{})
}

// stuckPending is how long a monitor pod may stay Pending before
// NewMonitorWith takes kwok to have missed it; kwok runs one within a
// second or two.
const stuckPending = 20 * time.Second

// NewMonitorWith is NewMonitor with options.
func NewMonitorWith(ctx context.Context, c *Cluster, b Binaries, dir, node, scenario string, o MonitorOptions) (*Monitor, error) {
	var pod string
	err := Poll(ctx, 2*time.Minute, func() (bool, string) {
		pods, err := c.Clientset.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/name=gpuhealth-monitor", FieldSelector: "spec.nodeName=" + node,
		})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				pod = p.Name
				return true, ""
			}
		}
		// kwok now and then misses a pod the DaemonSet controller created
		// the moment the node appeared, before kwok took the node up: it
		// stays Pending for good (2 of 200 in one soak setup). Deleted at
		// once (kwok would never finish a graceful deletion), it is created
		// again, and kwok runs the new one.
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodPending && p.DeletionTimestamp == nil && time.Since(p.CreationTimestamp.Time) > stuckPending {
				_ = c.Clientset.CoreV1().Pods(Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			}
		}
		return false, fmt.Sprintf("no running gpuhealth-monitor pod on %s yet (%d pods)", node, len(pods.Items))
	})
	if err != nil {
		return nil, err
	}
	nodeDir := filepath.Join(dir, node)
	if err := os.MkdirAll(nodeDir, 0o700); err != nil {
		return nil, err
	}
	kc := filepath.Join(nodeDir, "monitor.kubeconfig")
	if err := c.TokenKubeconfig(ctx, kc, Namespace, "gpuhealth-monitor", pod); err != nil {
		return nil, err
	}
	sc := filepath.Join(nodeDir, "scenario.txt")
	if err := os.WriteFile(sc, []byte(scenario), 0o600); err != nil {
		return nil, err
	}
	cfg := filepath.Join(nodeDir, "monitor.yaml")
	// Short intervals so the suite runs in seconds, not minutes.
	sources := []string{"nvml"}
	config := "nvml: {pollInterval: 1s, window: 5s, performance: {window: 4s}}\npublish: {window: 1s}\n"
	kmsg := ""
	if o.KernelLog {
		kmsg = filepath.Join(nodeDir, "kmsg")
		if err := os.WriteFile(kmsg, nil, 0o600); err != nil {
			return nil, err
		}
		sources = append(sources, "kmsg")
		config += fmt.Sprintf("kmsg: {path: %s}\n", kmsg)
	}
	sys := ""
	if len(o.PCIGPUs) > 0 || len(o.IB) > 0 {
		sys = filepath.Join(nodeDir, "sys")
		if err := os.RemoveAll(sys); err != nil {
			return nil, err
		}
		config += "inventory: {sysRoot: " + sys + "}\n"
	}
	if len(o.PCIGPUs) > 0 {
		if err := FakeSysfs(sys, o.PCIGPUs); err != nil {
			return nil, err
		}
	}
	if len(o.IB) > 0 {
		if err := ibfake.Write(sys, o.IB...); err != nil {
			return nil, err
		}
		// A port is down after 2 s, not 10: the suite runs in seconds.
		sources = append(sources, "ib")
		config += "ib: {downGrace: 2s}\n"
	}
	config = "sources: [" + strings.Join(sources, ", ") + "]\n" + config
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		return nil, err
	}
	health, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	metrics, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	spool := filepath.Join(nodeDir, "spool")
	return &Monitor{
		Node: node, Scenario: sc, SpoolDir: spool, KernelLog: kmsg, SysRoot: sys,
		Process: &Process{
			Name: "gpuhealth-monitor on " + node, LogPath: filepath.Join(nodeDir, "monitor.log"), Health: health, Metrics: metrics,
			bin: b.Monitor,
			args: []string{"--kubeconfig", kc, "--node-name", node, "--config", cfg, "--nvml-library", b.FakeNVML,
				"--spool-dir", spool, "--health-probe-bind-address", health, "--metrics-bind-address", metrics,
				// Plain HTTP on localhost: the suites and benchmarks scrape
				// the agents without a token.
				"--metrics-secure=false", "--zap-devel"},
			env: append(baseEnv(), fakenvml.ScenarioEnv+"="+sc),
		},
	}, nil
}

// Inject appends lines to the node's scenario; the fake NVML library reads
// them within 100 ms.
func (m *Monitor) Inject(lines ...string) error { return AppendScenario(m.Scenario, lines...) }

// InjectXID makes the node's GPU device raise an XID now.
func (m *Monitor) InjectXID(device, code int) error {
	return m.Inject(fmt.Sprintf("xid device=%d code=%d at=%s", device, code, fakenvml.At(time.Now().Add(200*time.Millisecond))))
}

// PCIBusID is the bus id the fake NVML scenario (Scenario) gives GPU
// device, as the driver's kernel log names it ("0000:38:00"; NVML adds
// ".0").
func PCIBusID(device int) string { return fmt.Sprintf("0000:%02x:00", 0x18+device*0x10) }

// InjectKernelXIDs appends n records of XID code on GPU device to the
// monitor's kernel log (MonitorOptions.KernelLog), as the driver prints
// them, chunk records at a time with pause between chunks (a burst), and
// returns how many it wrote: n, unless writing failed.
func (m *Monitor) InjectKernelXIDs(device, code, n, chunk int, pause time.Duration) (int, error) {
	if m.KernelLog == "" {
		return 0, fmt.Errorf("the monitor on %s reads no kernel log", m.Node)
	}
	if chunk <= 0 {
		chunk = n
	}
	m.kmsgMu.Lock()
	defer m.kmsgMu.Unlock()
	f, err := os.OpenFile(m.KernelLog, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	written := 0
	var b strings.Builder
	for i := range n {
		m.kmsgSeq++
		up, err := uptimeMicros()
		if err != nil {
			return written, err
		}
		fmt.Fprintf(&b, "3,%d,%d,-;NVRM: Xid (PCI:%s): %d, pid=1234, name=python, record %d\n", m.kmsgSeq, up, PCIBusID(device), code, i)
		if (i+1)%chunk == 0 || i == n-1 {
			if _, err := f.WriteString(b.String()); err != nil {
				return written, fmt.Errorf("appending to %s: %w", m.KernelLog, err)
			}
			written += (i % chunk) + 1
			b.Reset()
			if i < n-1 {
				time.Sleep(pause)
			}
		}
	}
	return written, nil
}

// uptimeMicros is this machine's uptime in microseconds: the clock of the
// kernel log's records.
func uptimeMicros() (int64, error) {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("/proc/uptime is empty")
	}
	up, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("parsing /proc/uptime: %w", err)
	}
	return int64(up * 1e6), nil
}

// FakeSysfs writes a sysfs tree under root whose PCI bus has an NVIDIA 3D
// controller at each of gpus (0000:18:00.0, ...).
func FakeSysfs(root string, gpus []string) error {
	for _, bus := range gpus {
		dir := filepath.Join(root, "bus", "pci", "devices", bus)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		for name, v := range map[string]string{"vendor": "0x10de\n", "class": "0x030200\n"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o600); err != nil {
				return err
			}
		}
	}
	return nil
}
