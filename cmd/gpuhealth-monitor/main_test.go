package main_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
	"github.com/gpuhealth/gpuhealth/monitors/fakenvml"
)

// The whole-process test: the real gpuhealth-monitor binary, loading the
// fake NVML library through go-nvml's real code path, against a real
// apiserver (envtest) reached through a TCP proxy the test can cut.

var (
	admin      client.Client
	binary     string
	library    string
	kubeconfig []byte
	apiAddr    string
)

func TestMain(m *testing.M) {
	tmp, err := os.MkdirTemp("", "gpuhealth-monitor-test-")
	if err != nil {
		panic(err)
	}
	code := testenv.Main(m, func(e *testenv.Env) error { return setUp(e, tmp) })
	_ = os.RemoveAll(tmp)
	os.Exit(code)
}

// setUp builds the monitor and the fake NVML library into tmp and gives the
// monitor processes an admin kubeconfig.
func setUp(e *testenv.Env, tmp string) error {
	binary = filepath.Join(tmp, "gpuhealth-monitor")
	if out, err := exec.Command("go", "build", "-o", binary, "github.com/gpuhealth/gpuhealth/cmd/gpuhealth-monitor").CombinedOutput(); err != nil {
		return fmt.Errorf("building gpuhealth-monitor: %w\n%s", err, out)
	}
	var err error
	if library, err = fakenvml.Build(tmp); err != nil {
		return fmt.Errorf("building the fake NVML library: %w", err)
	}
	admin = e.Client
	user, err := e.Environment.AddUser(envtest.User{Name: "monitor-test", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("adding a user: %w", err)
	}
	if kubeconfig, err = user.KubeConfig(); err != nil {
		return fmt.Errorf("writing a kubeconfig: %w", err)
	}
	u, err := url.Parse(e.Config.Host)
	if err != nil {
		return fmt.Errorf("parsing the apiserver address %q: %w", e.Config.Host, err)
	}
	if u.Host == "" {
		return fmt.Errorf("the apiserver address %q has no host", e.Config.Host)
	}
	apiAddr = u.Host
	SetDefaultEventuallyTimeout(20 * time.Second)
	SetDefaultEventuallyPollingInterval(50 * time.Millisecond)
	return nil
}

// proxy forwards TCP connections to the apiserver until it is cut; it can be
// restored on the same address, which plays an apiserver outage.
type proxy struct {
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	p := &proxy{target: target, conns: map[net.Conn]struct{}{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[up] = struct{}{}, struct{}{}
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
		}
	}()
}

// cut closes the listener and every open connection.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = map[net.Conn]struct{}{}
}

// restore listens again on the same address.
func (p *proxy) restore(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	p.serve(ln)
}

// node is one fake GPU node: its scenario file, spool, kubeconfig and the
// monitor process.
type node struct {
	t        *testing.T
	name     string
	dir      string
	scenario string
	kmsg     string
	kmsgSeq  int
	config   string
	kubecfg  string
	health   string
	metrics  string
	cmd      *exec.Cmd
	log      *os.File
	starts   int
}

const (
	gpu0 = "GPU-0d1c2b3a-0000-4000-8000-000000000000"
	gpu1 = "GPU-0d1c2b3a-1111-4000-8000-111111111111"
)

func newNode(t *testing.T, name, server string) *node {
	t.Helper()
	n := &node{t: t, name: name, dir: nodeDir(t)}
	n.scenario = filepath.Join(n.dir, "scenario.txt")
	writeFile(t, n.scenario, fmt.Sprintf(`# two GPUs with four NVLinks each and a healthy fabric
system driver=570.86.15 cuda=12040
device index=0 uuid=%s pci=0000:3b:00.0 name="NVIDIA H200" links=4 vbios=96.00.74.00.01 mig=off power=700
device index=1 uuid=%s pci=0000:5e:00.0 name="NVIDIA H200" links=4 vbios=96.00.61.00.01 mig=none power=600
fabric device=0 state=completed health=healthy status=success clique=7
fabric device=1 state=completed health=healthy status=success clique=7
clocks device=0 reasons=gpu_idle
pcie device=1
util device=1 gpu=0
`, gpu0, gpu1))
	// The kernel log is a regular file the test appends records to.
	n.kmsg = filepath.Join(n.dir, "kmsg")
	writeFile(t, n.kmsg, "")
	// A PCI bus with a third NVIDIA GPU, one NVML does not list.
	sys := filepath.Join(n.dir, "sys")
	for _, bus := range []string{"0000:3b:00.0", "0000:5e:00.0", "0000:af:00.0"} {
		dev := filepath.Join(sys, "bus", "pci", "devices", bus)
		if err := os.MkdirAll(dev, 0o700); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dev, "vendor"), "0x10de\n")
		writeFile(t, filepath.Join(dev, "class"), "0x030200\n")
	}
	n.config = filepath.Join(n.dir, "monitor.yaml")
	writeFile(t, n.config, fmt.Sprintf(`
sources: [nvml, kmsg]
nvml: {pollInterval: 100ms, window: 1s, thresholds: {CRC_FLIT: 1000}, performance: {window: 1s}}
kmsg: {path: %s}
publish: {window: 200ms}
inventory: {sysRoot: %s, interval: 1s}
`, n.kmsg, sys))
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + server
	}
	n.kubecfg = filepath.Join(n.dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, n.kubecfg); err != nil {
		t.Fatal(err)
	}
	n.health, n.metrics = freePort(t), freePort(t)
	t.Cleanup(n.stop)
	return n
}

// nodeDir is a node's folder (scenario, kernel log, spool, kmsg cursor,
// logs): in /dev/shm where there is one, else the test's temp dir. The
// spool and the cursor fsync every write, which guards against a machine
// crash; a SIGKILLed process, all these tests do, loses nothing fsync
// keeps, as the page cache outlives it. On this project's 2-core CI disk
// the fsyncs made TestKill9MidBurstKeepsExactCounts take 175 s, on
// /dev/shm 36 s.
func nodeDir(t *testing.T) string {
	t.Helper()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		//nolint:usetesting // t.TempDir cannot be told where to go.
		if dir, err := os.MkdirTemp("/dev/shm", "gpuhealth-monitor-test-"); err == nil {
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			return dir
		}
	}
	return t.TempDir()
}

// start runs the monitor binary.
func (n *node) start() {
	n.t.Helper()
	log, err := os.OpenFile(filepath.Join(n.dir, "monitor.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		n.t.Fatal(err)
	}
	n.log = log
	n.cmd = exec.Command(binary,
		"--kubeconfig="+n.kubecfg, "--node-name="+n.name, "--config="+n.config,
		"--nvml-library="+library, "--spool-dir="+filepath.Join(n.dir, "spool"),
		"--health-probe-bind-address="+n.health, "--metrics-bind-address="+n.metrics, "--metrics-secure=false", "--zap-devel")
	n.cmd.Env = append(os.Environ(), fakenvml.ScenarioEnv+"="+n.scenario)
	n.cmd.Stdout, n.cmd.Stderr = log, log
	if err := n.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	NewWithT(n.t).Eventually(func() error { return get("http://" + n.health + "/readyz") }).Should(Succeed())
	// Ready means the agent runs, not that NVML is initialised yet; an XID
	// injected before the fake library loads is older than its start and
	// (like a real XID from before the event set existed) never delivered.
	n.starts++
	NewWithT(n.t).Eventually(func() int {
		b, _ := os.ReadFile(filepath.Join(n.dir, "monitor.log"))
		return strings.Count(string(b), "Watching GPUs through NVML")
	}).Should(Equal(n.starts), "the nvml source is watching")
}

// stop ends the monitor with SIGTERM, as the kubelet does.
func (n *node) stop() {
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = n.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = n.cmd.Process.Kill()
		<-done
	}
	n.cmd = nil
	_ = n.log.Close()
	if n.t.Failed() {
		b, _ := os.ReadFile(filepath.Join(n.dir, "monitor.log"))
		n.t.Logf("monitor log:\n%s", b)
	}
}

// inject appends scenario lines; the fake library reads them within 100 ms.
func (n *node) inject(lines ...string) {
	n.t.Helper()
	f, err := os.OpenFile(n.scenario, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		n.t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	for _, l := range lines {
		if _, err := f.WriteString(l + "\n"); err != nil {
			n.t.Fatal(err)
		}
	}
}

// kernelXID appends the driver's kernel log record of an XID on the GPU at
// pci (the fake NVML's bus ids), stamped now by this machine's uptime.
func (n *node) kernelXID(pci string, code int) {
	n.t.Helper()
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		n.t.Fatal(err)
	}
	up, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	if err != nil {
		n.t.Fatal(err)
	}
	n.kmsgSeq++
	f, err := os.OpenFile(n.kmsg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		n.t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if _, err := fmt.Fprintf(f, "3,%d,%d,-;NVRM: Xid (PCI:%s): %d, pid=1234, name=python, test fault\n", n.kmsgSeq, int64(up*1e6), pci, code); err != nil {
		n.t.Fatal(err)
	}
}

// event returns a function for Eventually that reads one event of this node.
func (n *node) event(check gpuhealthv1alpha1.Check, component, code string) func(Gomega) *gpuhealthv1alpha1.NodeHealthEvent {
	return n.eventFrom(gpuhealthv1alpha1.SourceNVML, check, component, code)
}

// eventFrom is event for a finding of source src.
func (n *node) eventFrom(src gpuhealthv1alpha1.Source, check gpuhealthv1alpha1.Check, component, code string) func(Gomega) *gpuhealthv1alpha1.NodeHealthEvent {
	name := gpuhealthv1alpha1.EventName(n.name, src, check, component, code)
	return func(g Gomega) *gpuhealthv1alpha1.NodeHealthEvent {
		var e gpuhealthv1alpha1.NodeHealthEvent
		g.Expect(admin.Get(context.Background(), client.ObjectKey{Name: name}, &e)).To(Succeed())
		return &e
	}
}

func (n *node) spooled() int {
	entries, _ := os.ReadDir(filepath.Join(n.dir, "spool"))
	c := 0
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".json") {
			c++
		}
	}
	return c
}

func TestMonitorProcess(t *testing.T) {
	g := NewWithT(t)
	p := newProxy(t, apiAddr)
	// A fresh node name per run, so that -count=N does not meet the events
	// of the previous run on the shared apiserver.
	n := newNode(t, fmt.Sprintf("gpu-node-%d", time.Now().UnixNano()%1_000_000), p.addr)
	n.start()

	t.Run("an injected XID 79 becomes a Fatal event about the right GPU", func(t *testing.T) {
		g := NewWithT(t)
		n.inject(fmt.Sprintf("xid device=0 code=79 at=%s", fakenvml.At(time.Now())))
		g.Eventually(n.event(gpuhealthv1alpha1.CheckXID, gpu0, "79")).Should(WithTransform(
			func(e *gpuhealthv1alpha1.NodeHealthEvent) int64 { return e.Status.Count }, Equal(int64(1))))
		e := n.event(gpuhealthv1alpha1.CheckXID, gpu0, "79")(g)
		g.Expect(e.Spec.NodeName).To(Equal(n.name))
		g.Expect(e.Spec.Component).To(Equal(gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: gpu0}))
		g.Expect(e.Spec.Severity).To(Equal(gpuhealthv1alpha1.SeverityFatal))
		g.Expect(e.Spec.RecommendedAction).To(Equal(gpuhealthv1alpha1.ActionRebootNode))
	})

	t.Run("the node's stack is reported, and the GPU NVML does not list is missing", func(t *testing.T) {
		g := NewWithT(t)
		t.Cleanup(func() {
			_ = admin.Delete(context.Background(), &gpuhealthv1alpha1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: n.name}})
		})
		g.Eventually(func(g Gomega) {
			var inv gpuhealthv1alpha1.NodeInventory
			g.Expect(admin.Get(context.Background(), client.ObjectKey{Name: n.name}, &inv)).To(Succeed())
			g.Expect(inv.Spec.Driver).To(Equal(gpuhealthv1alpha1.DriverInventory{Version: "570.86.15", CUDAVersion: "12.4", NVMLVersion: "12.570.133.20"}))
			g.Expect(inv.Spec.GPUCount).To(Equal(ptr.To(int32(2))))
			g.Expect(inv.Spec.GPUs).To(Equal([]gpuhealthv1alpha1.GPUInventory{
				{Index: 0, UUID: gpu0, PCIBusID: "0000:3b:00.0", Product: "NVIDIA H200", VBIOS: "96.00.74.00.01", InfoROM: "G520.0200.00.05",
					ECC: "Enabled", Persistence: "Enabled", MIG: "Disabled", PowerLimitWatts: 700},
				{Index: 1, UUID: gpu1, PCIBusID: "0000:5e:00.0", Product: "NVIDIA H200", VBIOS: "96.00.61.00.01", InfoROM: "G520.0200.00.05",
					ECC: "Enabled", Persistence: "Enabled", PowerLimitWatts: 600},
			}), "MIG not supported on the second GPU: left empty")
			g.Expect(inv.Spec.PCI).To(Equal(gpuhealthv1alpha1.PCIInventory{GPUs: 3, NotInNVML: []string{"0000:af:00.0"}}))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		g.Eventually(n.eventFrom(gpuhealthv1alpha1.SourceNVML, gpuhealthv1alpha1.CheckGPUMissing, "", "PCI")).Should(WithTransform(
			func(e *gpuhealthv1alpha1.NodeHealthEvent) string { return e.Spec.Message },
			Equal("NVML lists 2 GPUs, the PCI bus has 3 NVIDIA GPUs; not in NVML: 0000:af:00.0")))
	})

	t.Run("an XID both NVML and the kernel log see is one finding; one only the kernel log sees is its own", func(t *testing.T) {
		g := NewWithT(t)
		n.inject(fmt.Sprintf("xid device=0 code=31 at=%s", fakenvml.At(time.Now())))
		n.kernelXID("0000:3b:00", 31)
		n.kernelXID("0000:5e:00", 43) // NVML did not deliver this one
		g.Eventually(n.eventFrom(gpuhealthv1alpha1.SourceKmsg, gpuhealthv1alpha1.CheckXID, gpu1, "43")).Should(
			WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) int64 { return e.Status.Count }, Equal(int64(1))))
		// XID 31 is one object, under whichever source's copy came first.
		copies := func() (names []string) {
			for _, src := range []gpuhealthv1alpha1.Source{gpuhealthv1alpha1.SourceNVML, gpuhealthv1alpha1.SourceKmsg} {
				name := gpuhealthv1alpha1.EventName(n.name, src, gpuhealthv1alpha1.CheckXID, gpu0, "31")
				e := &gpuhealthv1alpha1.NodeHealthEvent{}
				if err := admin.Get(context.Background(), client.ObjectKey{Name: name}, e); err == nil && e.Status.Count == 1 {
					names = append(names, string(src))
				} else if err != nil && !apierrors.IsNotFound(err) {
					t.Error(err)
				}
			}
			return names
		}
		g.Eventually(copies).Should(HaveLen(1))
		g.Consistently(copies, 2*time.Second).Should(HaveLen(1), "the other source's copy is not a second object")
		body, err := fetch("http://" + n.metrics + "/metrics")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(body).To(ContainSubstring("gpuhealth_monitor_xid_duplicates_total 1"))
	})

	t.Run("a CRC-rate burst becomes a Degraded NVLink finding that resolves when the rate drops", func(t *testing.T) {
		g := NewWithT(t)
		link := gpu1 + "/link-2"
		n.inject(fmt.Sprintf("nvlink device=1 link=2 counter=crc_flit rate=5000 from=%s for=2s", fakenvml.At(time.Now())))
		g.Eventually(n.event(gpuhealthv1alpha1.CheckNVLinkErrors, link, "CRC_FLIT")).Should(WithTransform(
			func(e *gpuhealthv1alpha1.NodeHealthEvent) bool { return e.Status.Count >= 1 && !e.Status.Resolved }, BeTrue()))
		e := n.event(gpuhealthv1alpha1.CheckNVLinkErrors, link, "CRC_FLIT")(g)
		g.Expect(e.Spec.Severity).To(Equal(gpuhealthv1alpha1.SeverityDegraded))
		g.Expect(e.Spec.Component.Kind).To(Equal(gpuhealthv1alpha1.ComponentNVLink))
		g.Eventually(n.event(gpuhealthv1alpha1.CheckNVLinkErrors, link, "CRC_FLIT")).Should(WithTransform(
			func(e *gpuhealthv1alpha1.NodeHealthEvent) bool { return e.Status.Resolved }, BeTrue()))
	})

	t.Run("an unhealthy fabric becomes a Fatal Fabric finding", func(t *testing.T) {
		g := NewWithT(t)
		n.inject(fmt.Sprintf("fabric device=1 state=completed health=unhealthy status=success clique=7 at=%s", fakenvml.At(time.Now())))
		g.Eventually(n.event(gpuhealthv1alpha1.CheckFabric, gpu1, "UNHEALTHY")).Should(WithTransform(
			func(e *gpuhealthv1alpha1.NodeHealthEvent) gpuhealthv1alpha1.Severity { return e.Spec.Severity }, Equal(gpuhealthv1alpha1.SeverityFatal)))
	})

	t.Run("a GPU throttled by HW slowdown for most of the window is a Throttled finding, its signals in the metrics", func(t *testing.T) {
		g := NewWithT(t)
		now := time.Now()
		n.inject(fmt.Sprintf("clocks device=0 reasons=hw_slowdown sm=1200 at=%s", fakenvml.At(now)),
			fmt.Sprintf("clocks device=0 reasons=gpu_idle at=%s", fakenvml.At(now.Add(2*time.Second))))
		throttled := n.event(gpuhealthv1alpha1.CheckThrottled, gpu0, "HW_SLOWDOWN")
		g.Eventually(throttled).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) int64 { return e.Status.Count }, BeNumerically(">=", 1)))
		e := throttled(g)
		g.Expect(e.Spec.Severity).To(Equal(gpuhealthv1alpha1.SeverityDegraded))
		g.Expect(e.Spec.RecommendedAction).To(Equal(gpuhealthv1alpha1.ActionRecertify))
		g.Expect(e.Spec.Message).To(ContainSubstring("SM clock 1200 of 1980 MHz"))
		body, err := fetch("http://" + n.metrics + "/metrics")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(body).To(ContainSubstring(`gpuhealth_monitor_gpu_clocks_event_seconds_total{gpu="0",reason="hw_slowdown",uuid="` + gpu0 + `"}`))
		g.Expect(body).To(ContainSubstring(`gpuhealth_monitor_gpu_pcie_link_width{gpu="1",uuid="` + gpu1 + `"} 16`))
		g.Eventually(throttled).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) bool { return e.Status.Resolved }, BeTrue()),
			"resolved once the throttle ended")
	})

	t.Run("findings made during an apiserver outage survive a restart and arrive once", func(t *testing.T) {
		g := NewWithT(t)
		p.cut()
		n.inject(fmt.Sprintf("xid device=1 code=48 at=%s", fakenvml.At(time.Now())))
		// Wait for this finding's own record: another one (a status patch
		// the cut interrupted) may be spooled already, and stopping before
		// the XID is read would lose it for a reason the test is not about.
		record := filepath.Join(n.dir, "spool",
			gpuhealthv1alpha1.EventName(n.name, gpuhealthv1alpha1.SourceNVML, gpuhealthv1alpha1.CheckXID, gpu1, "48")+".json")
		g.Eventually(record).Should(BeAnExistingFile(), "the finding waits in the spool")
		n.stop()
		n.start()
		p.restore(t)
		xid48 := n.event(gpuhealthv1alpha1.CheckXID, gpu1, "48")
		g.Eventually(xid48).Should(WithTransform(
			func(e *gpuhealthv1alpha1.NodeHealthEvent) int64 { return e.Status.Count }, Equal(int64(1))))
		g.Eventually(n.spooled).Should(BeZero())
		g.Consistently(xid48, time.Second).Should(WithTransform(
			func(e *gpuhealthv1alpha1.NodeHealthEvent) int64 { return e.Status.Count }, Equal(int64(1))), "not counted twice")
		g.Expect(n.event(gpuhealthv1alpha1.CheckXID, gpu0, "79")(g).Status.Count).To(Equal(int64(1)), "the restarted monitor does not see old XIDs again")
	})

	t.Run("an agent that reads its node's labels starts during an apiserver outage, watches and spools", func(t *testing.T) {
		g := NewWithT(t)
		// The imex source reads the Node's labels through a cache, which
		// once needed the apiserver to be created: restarted in an outage,
		// the agent exited until the apiserver came back, blind meanwhile.
		p2 := newProxy(t, apiAddr)
		p2.cut()
		n2 := newNode(t, n.name+"-imex", p2.addr)
		writeFile(t, n2.config, fmt.Sprintf("sources: [nvml, kmsg, imex]\nkmsg: {path: %s}\npublish: {window: 200ms}\nimex: {command: /nonexistent/nvidia-imex-ctl}\n", n2.kmsg))
		n2.start()
		n2.inject(fmt.Sprintf("xid device=0 code=48 at=%s", fakenvml.At(time.Now().Add(100*time.Millisecond))))
		record := filepath.Join(n2.dir, "spool",
			gpuhealthv1alpha1.EventName(n2.name, gpuhealthv1alpha1.SourceNVML, gpuhealthv1alpha1.CheckXID, gpu0, "48")+".json")
		g.Eventually(record).Should(BeAnExistingFile(), "the finding waits in the spool")
		p2.restore(t)
		g.Eventually(n2.event(gpuhealthv1alpha1.CheckXID, gpu0, "48")).Should(WithTransform(
			func(e *gpuhealthv1alpha1.NodeHealthEvent) int64 { return e.Status.Count }, Equal(int64(1))))
		g.Eventually(n2.spooled).Should(BeZero())
	})

	t.Run("metrics count the findings by source, check and severity", func(t *testing.T) {
		g := NewWithT(t)
		body, err := fetch("http://" + n.metrics + "/metrics")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(body).To(ContainSubstring(`gpuhealth_monitor_source_up{source="nvml"} 1`))
		g.Expect(body).To(ContainSubstring(`gpuhealth_monitor_spool_records 0`))
		g.Expect(body).To(ContainSubstring("gpuhealth_monitor_publish_latency_seconds_bucket"))
	})
	g.Expect(get("http://" + n.health + "/healthz")).To(Succeed())
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String()
}

func fetch(url string) (string, error) {
	resp, err := http.Get(url) //nolint:gosec // a test URL on localhost
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s: %s", url, resp.Status, b)
	}
	return string(b), err
}

func get(url string) error {
	_, err := fetch(url)
	return err
}

// kill ends the monitor with SIGKILL: no cursor save, no spool flush.
func (n *node) kill() {
	n.t.Helper()
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	_ = n.cmd.Wait()
	n.cmd = nil
	_ = n.log.Close()
}

// kernelBurst appends count XID records on the GPU at pci, in chunks, so
// that the burst takes a while to write, as a storm does.
func (n *node) kernelBurst(pci string, code, count, chunk int, pause time.Duration) {
	n.t.Helper()
	f, err := os.OpenFile(n.kmsg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		n.t.Error(err)
		return
	}
	defer func() { _ = f.Close() }()
	var b strings.Builder
	for i := range count {
		n.kmsgSeq++
		fmt.Fprintf(&b, "3,%d,%d,-;NVRM: Xid (PCI:%s): %d, pid=1234, name=python, burst %d\n", n.kmsgSeq, 1000+n.kmsgSeq, pci, code, i)
		if (i+1)%chunk == 0 || i == count-1 {
			if _, err := f.WriteString(b.String()); err != nil {
				n.t.Error(err)
				return
			}
			b.Reset()
			time.Sleep(pause)
		}
	}
}

// TestKill9MidBurstKeepsExactCounts kills the monitor with SIGKILL in the
// middle of a burst of kernel log XIDs, twenty times, restarting it each
// time: the event's count must be exactly the number of lines, every time.
// The cursor may not run ahead of the spooled counts (a loss), and no count
// may be published before a cursor covers it (a double count on replay).
func TestKill9MidBurstKeepsExactCounts(t *testing.T) {
	g := NewWithT(t)
	n := newNode(t, fmt.Sprintf("gpu-kill-%d", time.Now().UnixNano()%1_000_000), apiAddr)
	const (
		rounds = 20
		burst  = 5000
	)
	// Records read before NVML named the GPUs are about its PCI bus id.
	count := func() int64 {
		total := int64(0)
		for _, id := range []string{gpu0, "0000:3b:00.0"} {
			e := &gpuhealthv1alpha1.NodeHealthEvent{}
			name := gpuhealthv1alpha1.EventName(n.name, gpuhealthv1alpha1.SourceKmsg, gpuhealthv1alpha1.CheckXID, id, "79")
			if err := admin.Get(context.Background(), client.ObjectKey{Name: name}, e); err == nil {
				total += e.Status.Count
			}
		}
		return total
	}
	for round := 1; round <= rounds; round++ {
		n.start()
		done := make(chan struct{})
		go func() {
			defer close(done)
			n.kernelBurst("0000:3b:00", 79, burst, 250, 5*time.Millisecond)
		}()
		time.Sleep(time.Duration(20+(round*37)%180) * time.Millisecond)
		n.kill()
		<-done
		n.start()
		want := int64(round * burst)
		g.Eventually(count, 30*time.Second).Should(Equal(want), "round %d", round)
		g.Consistently(count, 500*time.Millisecond).Should(Equal(want), "round %d: nothing counted twice", round)
		n.kill()
	}
}
