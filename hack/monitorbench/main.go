// Command monitorbench measures the node agent, gpuhealth-monitor, as it runs
// on a node: the real binary, loading the fake NVML library through go-nvml's
// real code path, against a real kube-apiserver and etcd (envtest's control
// plane from the cached binaries). In one run it measures:
//
//   - injection-to-object latency: XIDs scheduled in the fake library's
//     scenario at a known time (on a fresh GPU each, so each makes a new
//     NodeHealthEvent), to the moment a watch sees the event with its count;
//     p50, p90, p99 and max;
//   - a storm: 10,000 identical XIDs within about two seconds on one GPU;
//     the count on the object and the agent's writes (its own
//     gpuhealth_monitor_writes_total), as writes per second;
//   - idle cost, measured first on the fresh agent: its CPU (utime+stime
//     from /proc) and RSS over an idle minute with 8 GPUs × 18 NVLinks
//     polled every 10 s. The fake library's event wait polls every 10 ms
//     where the real one blocks in the driver, so this is an upper bound.
//     Beside it, over the same minute, the same agent with the ib source
//     reading 8 InfiniBand adapters (a fake sysfs tree, monitors/ib/ibfake)
//     every second: the difference between the two is the ib source's cost.
//
// Run it from the repository root:
//
//	KUBEBUILDER_ASSETS=$(hack/controlplane.sh | tail -1) go run ./hack/monitorbench
//	make bench-monitor
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/api/xid"
	"github.com/gpuhealth/gpuhealth/monitors/fakenvml"
	"github.com/gpuhealth/gpuhealth/monitors/ib/ibfake"
)

func main() {
	samples := flag.Int("latency-samples", 100, "XIDs for the latency measurement, one at a time.")
	storm := flag.Int("storm", 10000, "Identical XIDs in the storm.")
	idle := flag.Duration("idle", time.Minute, "How long to measure the idle agent.")
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	if err := run(*samples, *storm, *idle); err != nil {
		fmt.Fprintln(os.Stderr, "monitorbench:", err)
		os.Exit(1)
	}
}

const gpus, links = 8, 18

// hcaCount is the InfiniBand adapters of the ib source's idle run: a GPU
// node has one per GPU.
const hcaCount = 8

func uuid(i int) string { return fmt.Sprintf("GPU-%08d-0000-4000-8000-000000000000", i) }

func run(samples, storm int, idle time.Duration) error {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return fmt.Errorf("KUBEBUILDER_ASSETS is not set; use make bench-monitor")
	}
	tmp, err := os.MkdirTemp("", "monitorbench-")
	if err != nil {
		return err
	}
	defer func() {
		if os.Getenv("MONITORBENCH_KEEP") == "" {
			_ = os.RemoveAll(tmp)
		}
	}()
	bin := filepath.Join(tmp, "gpuhealth-monitor")
	fmt.Fprintln(os.Stderr, "building gpuhealth-monitor and the fake NVML library")
	// Built as the Dockerfile builds it: what runs on the nodes.
	if out, err := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/gpuhealth-monitor").CombinedOutput(); err != nil {
		return fmt.Errorf("building: %w\n%s", err, out)
	}
	lib, err := fakenvml.Build(tmp)
	if err != nil {
		return err
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{"config/crd"}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("starting the control plane: %w", err)
	}
	defer func() { _ = env.Stop() }()
	scheme := env.Scheme
	if err := gpuhealthv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	user, err := env.AddUser(envtest.User{Name: "monitorbench", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(tmp, "kubeconfig")
	scenario := filepath.Join(tmp, "scenario.txt")
	config := filepath.Join(tmp, "monitor.yaml")
	var sc strings.Builder
	for i := range gpus {
		fmt.Fprintf(&sc, "device index=%d uuid=%s pci=0000:%02x:00.0 links=%d\n", i, uuid(i), 0x10+i, links)
		fmt.Fprintf(&sc, "fabric device=%d state=completed health=healthy\n", i)
	}
	for name, data := range map[string]string{
		kubeconfig: string(kc), scenario: sc.String(),
		config: "sources: [nvml]\nnvml: {pollInterval: 10s}\n",
	} {
		if err := os.WriteFile(name, []byte(data), 0o600); err != nil {
			return err
		}
	}
	startAgent := func(node, config string) (*exec.Cmd, string, error) {
		metricsAddr := freePort()
		cmd := exec.Command(bin, "--kubeconfig="+kubeconfig, "--node-name="+node, "--config="+config,
			"--nvml-library="+lib, "--spool-dir="+filepath.Join(tmp, "spool-"+node),
			"--metrics-bind-address="+metricsAddr, "--metrics-secure=false", "--health-probe-bind-address="+freePort())
		cmd.Env = append(os.Environ(), fakenvml.ScenarioEnv+"="+scenario)
		logf, err := os.Create(filepath.Join(tmp, node+".log"))
		if err != nil {
			return nil, "", err
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			return nil, "", err
		}
		return cmd, metricsAddr, nil
	}
	cmd, metricsAddr, err := startAgent("bench-node", config)
	if err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }()
	// Beside it, over the same idle minute, the same agent with the ib
	// source too, polling 8 InfiniBand adapters (one port each) every
	// second: the difference is the ib source's cost.
	sys := filepath.Join(tmp, "sys")
	var hcas []ibfake.HCA
	for i := range hcaCount {
		hcas = append(hcas, ibfake.InfiniBand(i))
	}
	if err := ibfake.Write(sys, hcas...); err != nil {
		return err
	}
	ibConfig := filepath.Join(tmp, "monitor-ib.yaml")
	if err := os.WriteFile(ibConfig, []byte("sources: [nvml, ib]\nnvml: {pollInterval: 10s}\nib: {interval: 1s, sysRoot: "+sys+"}\n"), 0o600); err != nil {
		return err
	}
	ibCmd, ibMetricsAddr, err := startAgent("bench-node-ib", ibConfig)
	if err != nil {
		return err
	}
	defer func() {
		if ibCmd.ProcessState == nil {
			_ = ibCmd.Process.Signal(syscall.SIGTERM)
			_ = ibCmd.Wait()
		}
	}()
	time.Sleep(2 * time.Second) // let it start and learn the API

	ctx := context.Background()
	w, err := c.Watch(ctx, &gpuhealthv1alpha1.NodeHealthEventList{})
	if err != nil {
		return err
	}
	defer w.Stop()
	seen := map[string]time.Time{}
	waitFor := func(name string, deadline time.Duration, ok func(*gpuhealthv1alpha1.NodeHealthEvent) bool) (time.Time, error) {
		timeout := time.After(deadline)
		for {
			select {
			case ev := <-w.ResultChan():
				if ev.Type == watch.Error {
					return time.Time{}, fmt.Errorf("watch error: %v", ev.Object)
				}
				e, isEvent := ev.Object.(*gpuhealthv1alpha1.NodeHealthEvent)
				if isEvent && ok(e) {
					if _, dup := seen[e.Name+strconv.FormatInt(e.Status.Count, 10)]; !dup {
						seen[e.Name+strconv.FormatInt(e.Status.Count, 10)] = time.Now()
					}
					if e.Name == name {
						return time.Now(), nil
					}
				}
			case <-timeout:
				return time.Time{}, fmt.Errorf("timed out waiting for %s", name)
			}
		}
	}
	appendLine := func(line string) error {
		f, err := os.OpenFile(scenario, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		_, err = f.WriteString(line)
		return err
	}

	// Idle: nothing injected; 8 GPUs × 18 links polled every 10 s, and
	// beside it the agent that also polls 8 adapters every second.
	fmt.Fprintf(os.Stderr, "idle: %s\n", idle)
	cpu0, err := cpuSeconds(cmd.Process.Pid)
	if err != nil {
		return err
	}
	ibCPU0, err := cpuSeconds(ibCmd.Process.Pid)
	if err != nil {
		return err
	}
	time.Sleep(idle)
	cpu1, err := cpuSeconds(cmd.Process.Pid)
	if err != nil {
		return err
	}
	ibCPU1, err := cpuSeconds(ibCmd.Process.Pid)
	if err != nil {
		return err
	}
	rss, err := rssMiB(cmd.Process.Pid)
	if err != nil {
		return err
	}
	ibRSS, err := rssMiB(ibCmd.Process.Pid)
	if err != nil {
		return err
	}
	ibPorts, err := metric(ibMetricsAddr, "gpuhealth_monitor_nic_port_up")
	if err != nil {
		return err
	}
	// The rest measures one agent: the second one goes.
	_ = ibCmd.Process.Signal(syscall.SIGTERM)
	_ = ibCmd.Wait()

	// Latency: one XID at a time, each with a code not used before on its
	// GPU, scheduled 300 ms ahead so the fake library (which reads appended
	// lines every 100 ms) delivers it exactly on time.
	fmt.Fprintf(os.Stderr, "latency: %d XIDs one at a time\n", samples)
	// Catalog codes whose event is named by the finding alone: an XID
	// judged per occurrence (from its line, or from the XIDs beside it:
	// 45 after another XID is cleanup) is named by its verdict too, which
	// the bench does not know beforehand.
	var codes []int
	for c := 1; len(codes) < 32 && c <= xid.MaxCode; c++ {
		if xid.Lookup(c, "").Known && !xid.JudgedPerOccurrence(c) {
			codes = append(codes, c)
		}
	}
	var lat []time.Duration
	for i := range samples {
		gpu, code := i%gpus, codes[(i/gpus)%len(codes)]
		at := time.Now().Add(300 * time.Millisecond)
		if err := appendLine(fmt.Sprintf("xid device=%d code=%d at=%s\n", gpu, code, fakenvml.At(at))); err != nil {
			return err
		}
		name := gpuhealthv1alpha1.EventName("bench-node", gpuhealthv1alpha1.SourceNVML, gpuhealthv1alpha1.CheckXID, uuid(gpu), strconv.Itoa(code))
		got, err := waitFor(name, 30*time.Second, func(e *gpuhealthv1alpha1.NodeHealthEvent) bool { return e.Status.Count >= 1 })
		if err != nil {
			return err
		}
		lat = append(lat, got.Sub(at))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })

	// Storm: N identical XIDs spread over two seconds, on GPU 0, code 109.
	fmt.Fprintf(os.Stderr, "storm: %d identical XIDs\n", storm)
	writesBefore, err := metric(metricsAddr, "gpuhealth_monitor_writes_total")
	if err != nil {
		return err
	}
	start := time.Now().Add(500 * time.Millisecond)
	var b strings.Builder
	for i := range storm {
		fmt.Fprintf(&b, "xid device=0 code=109 at=%s\n", fakenvml.At(start.Add(time.Duration(i)*2*time.Second/time.Duration(storm))))
	}
	if err := appendLine(b.String()); err != nil {
		return err
	}
	stormName := gpuhealthv1alpha1.EventName("bench-node", gpuhealthv1alpha1.SourceNVML, gpuhealthv1alpha1.CheckXID, uuid(0), "109")
	done, err := waitFor(stormName, 60*time.Second, func(e *gpuhealthv1alpha1.NodeHealthEvent) bool { return e.Status.Count >= int64(storm) })
	if err != nil {
		return err
	}
	var stormEvent gpuhealthv1alpha1.NodeHealthEvent
	if err := c.Get(ctx, client.ObjectKey{Name: stormName}, &stormEvent); err != nil {
		return err
	}
	writesAfter, err := metric(metricsAddr, "gpuhealth_monitor_writes_total")
	if err != nil {
		return err
	}
	stormWrites := writesAfter - writesBefore
	stormSpan := done.Sub(start)

	pct := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1)+0.5)] }
	fmt.Printf("| Run | |\n|---|---|\n| Date | %s |\n| Command | `make bench-monitor` |\n| CPUs | %d |\n| Agent | real gpuhealth-monitor binary, fake libnvidia-ml.so.1 (%d GPUs × %d NVLinks), real kube-apiserver v1.37.2 + etcd (envtest) |\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), gpus, links)
	fmt.Printf("| XID injected in NVML → NodeHealthEvent seen in a watch (%d samples, each a new object) | p50 | p90 | p99 | max |\n|---|---:|---:|---:|---:|\n| latency | %s | %s | %s | %s |\n\n",
		len(lat), ms(pct(.5)), ms(pct(.9)), ms(pct(.99)), ms(lat[len(lat)-1]))
	fmt.Printf("| Storm | |\n|---|---:|\n| identical XIDs delivered by NVML | %d over 2 s |\n| objects | 1 (count %d) |\n| agent writes (create + status patches) | %.0f |\n| writes per second during the storm | %.1f |\n| last XID → count complete on the apiserver | %s |\n\n",
		storm, stormEvent.Status.Count, stormWrites, stormWrites/stormSpan.Seconds(), ms(done.Sub(start.Add(2*time.Second))))
	fmt.Printf("| Idle agent (%d GPUs × %d NVLinks, polled every 10 s, measured over %s) | |\n|---|---:|\n| CPU | %.2f%% of one core |\n| RSS | %.1f MiB |\n\n",
		gpus, links, idle, 100*(cpu1-cpu0)/idle.Seconds(), rss)
	base, withIB := 100*(cpu1-cpu0)/idle.Seconds(), 100*(ibCPU1-ibCPU0)/idle.Seconds()
	fmt.Printf("| The same, beside it over the same %s, with the ib source polling %d InfiniBand adapters × 1 port every second (%.0f ports up) | |\n|---|---:|\n| CPU | %.2f%% of one core |\n| of which the ib source (difference) | %.2f%% of one core |\n| RSS | %.1f MiB |\n",
		idle, hcaCount, ibPorts, withIB, withIB-base, ibRSS)
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

func freePort() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String()
}

// metric sums every series of a counter on the agent's metrics endpoint.
func metric(addr, name string) (float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	sum := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err == nil {
				sum += v
			}
		}
	}
	return sum, nil
}

// cpuSeconds reads utime+stime of a process from /proc/<pid>/stat.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseFloat(fields[11], 64)
	st, _ := strconv.ParseFloat(fields[12], 64)
	return (ut + st) / 100, nil // USER_HZ is 100 on Linux
}

// rssMiB reads VmRSS of a process.
func rssMiB(pid int) (float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "VmRSS:") {
			kb, _ := strconv.ParseFloat(strings.Fields(sc.Text())[1], 64)
			return kb / 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}
