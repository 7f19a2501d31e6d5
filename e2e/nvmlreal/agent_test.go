//go:build nvmlreal

package nvmlreal

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpuhealth/gpuhealth/monitors/agent"
)

// The agent's log messages this test waits for (monitors/agent).
const (
	msgUnavailable  = "Source cannot run on this node now; continuing without it and trying again"
	msgStillUnavail = "Source still cannot run on this node"
	msgServing      = "Serving"
	msgStopped      = "Stopped; unacknowledged findings stay in the spool"
)

// TestAgentWithoutDriver runs the real gpuhealth-monitor with NVIDIA's real
// library on a machine without the NVIDIA kernel driver, as on a GPU node
// whose driver container has not loaded the module yet: the nvml source
// must be unavailable in NVML's own words and tried again, the kmsg source
// must run meanwhile, and the process must stay up and healthy.
func TestAgentWithoutDriver(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	nv := realLibrary(t)

	// Ask the real library, in this process, what it says here.
	lib := gonvml.New(gonvml.WithLibraryPath(nv.path))
	ret := lib.Init()
	switch ret {
	case gonvml.SUCCESS:
		_ = lib.Shutdown()
		t.Skip("NVML initialised: this machine has an NVIDIA driver; the tier checks the agent on a machine without one")
	case gonvml.ERROR_DRIVER_NOT_LOADED:
	default:
		t.Skipf("NVML's nvmlInit says %q (%d), not that the driver is not loaded: the tier checks the agent on a machine without an NVIDIA driver", lib.ErrorString(ret), int32(ret))
	}
	// go-nvml answers with its own names (ERROR_DRIVER_NOT_LOADED) until
	// the library is loaded, then with nvmlErrorString's.
	nvmlSays := lib.ErrorString(ret)
	g.Expect(nvmlSays).NotTo(Or(BeEmpty(), HavePrefix("ERROR_")), "the real library's nvmlErrorString")
	t.Logf("Real NVML: %s; nvmlInit here: %q", nv.describe(t), nvmlSays)
	if smi := filepath.Join(nv.dir, "nvidia-smi"); fileExists(smi) {
		// NVIDIA's own tool on the same library agrees (exit 9: "NVIDIA
		// driver is not loaded", nvidia-smi(1)).
		cmd := exec.Command(smi)
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+nv.dir)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		g.Expect(errors.As(err, &exit)).To(BeTrue(), "nvidia-smi without a driver: %v\n%s", err, out)
		g.Expect(exit.ExitCode()).To(Equal(9), "nvidia-smi's exit status for a driver that is not loaded\n%s", out)
		t.Logf("nvidia-smi %s: exit %d: %s", nv.driver, exit.ExitCode(), strings.TrimSpace(string(out)))
	}

	dir := t.TempDir()
	binary := filepath.Join(dir, "gpuhealth-monitor")
	build := exec.Command("go", "build", "-o", binary, "github.com/gpuhealth/gpuhealth/cmd/gpuhealth-monitor")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building gpuhealth-monitor: %v\n%s", err, out)
	}
	// One XID in the kernel log, for the kmsg source to find while the
	// nvml source waits for the driver.
	kmsg := filepath.Join(dir, "kmsg")
	writeFile(t, kmsg, "3,1,1000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n")
	config := filepath.Join(dir, "monitor.yaml")
	writeFile(t, config, fmt.Sprintf("sources: [nvml, kmsg]\nkmsg: {path: %s}\n", kmsg))
	// No apiserver: port 1 is privileged and unused, so every write fails
	// at once and the findings wait in the spool, as during an outage.
	kubeconfig := filepath.Join(dir, "kubeconfig")
	writeFile(t, kubeconfig, `apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
`)
	logPath := filepath.Join(dir, "monitor.log")
	logFile, err := os.Create(logPath)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = logFile.Close() }()
	// The metrics and the probes on one address the kernel picks (the
	// agent serves both there when metrics are plain HTTP); the agent logs
	// it at debug level, which also shows each later try of the source.
	cmd := exec.Command(binary, "--kubeconfig="+kubeconfig, "--node-name=nvml-real", "--config="+config,
		"--spool-dir="+filepath.Join(dir, "spool"), "--metrics-secure=false",
		"--metrics-bind-address=127.0.0.1:0", "--health-probe-bind-address=127.0.0.1:0", "--zap-log-level=debug")
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+nv.dir)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	g.Expect(cmd.Start()).To(Succeed())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("monitor log:\n%s", b)
		}
	})
	logs := func() []logLine { return readLog(t, logPath) }

	var addr string
	g.Eventually(func() string {
		if l, ok := find(logs(), msgServing, ""); ok {
			addr = l.Address
		}
		return addr
	}, 20*time.Second, 50*time.Millisecond).ShouldNot(BeEmpty(), "the agent serves its probes and metrics")

	retry := agent.DefaultRetryInterval
	var first, second logLine
	g.Eventually(func() bool {
		var ok bool
		first, ok = find(logs(), msgUnavailable, "nvml")
		return ok
	}, 10*time.Second, 50*time.Millisecond).Should(BeTrue(), "the nvml source is reported unavailable")
	g.Expect(first.Err).To(ContainSubstring("initializing NVML: "+nvmlSays), "in NVML's own words")
	g.Expect(first.RetryIn).To(Equal(retry.String()))
	t.Logf("First try: %s", first.Err)

	// The retry interval is not configurable; the test waits for the
	// default first interval.
	g.Eventually(func() bool {
		var ok bool
		second, ok = find(logs(), msgStillUnavail, "nvml")
		return ok
	}, retry+10*time.Second, 100*time.Millisecond).Should(BeTrue(), "the nvml source is tried again")
	g.Expect(second.Err).To(Equal(first.Err))
	gap := second.Time.Sub(first.Time)
	g.Expect(gap).To(BeNumerically("~", retry, time.Second), "the second try comes one retry interval after the first")
	t.Logf("Second try %s after the first, next in %s", gap.Round(time.Millisecond), second.RetryIn)

	families := scrape(g, "http://"+addr+"/metrics")
	g.Expect(gauge(families, "gpuhealth_monitor_source_up", "source", "nvml")).To(Equal(0.0), "nvml is down")
	g.Expect(gauge(families, "gpuhealth_monitor_source_up", "source", "kmsg")).To(Equal(1.0), "kmsg is up")
	g.Expect(gauge(families, "gpuhealth_monitor_kmsg_lines_total", "result", "finding")).To(Equal(1.0), "kmsg found the XID")
	g.Expect(get(g, "http://"+addr+"/healthz")).To(Equal("ok"))

	select {
	case <-exited:
		t.Fatalf("the agent exited after the retries: %v", cmd.ProcessState)
	default:
	}
	g.Expect(cmd.Process.Signal(syscall.SIGTERM)).To(Succeed())
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not stop within 10 s of SIGTERM")
	}
	g.Expect(cmd.ProcessState.ExitCode()).To(Equal(0), "a clean stop after SIGTERM")
	_, stopped := find(logs(), msgStopped, "")
	g.Expect(stopped).To(BeTrue())
	b, err := os.ReadFile(logPath)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(b)).NotTo(Or(ContainSubstring("symbol lookup error"), ContainSubstring("panic"), ContainSubstring("fatal error")))
}

// logLine is one line of the agent's JSON log (zap's production encoder).
type logLine struct {
	Msg     string `json:"msg"`
	TS      string `json:"ts"`
	Source  string `json:"source"`
	Err     string `json:"err"`
	RetryIn string `json:"retryIn"`
	Address string `json:"address"`
	// Time is TS parsed.
	Time time.Time `json:"-"`
}

// readLog reads the agent's log; lines that are not JSON are skipped.
func readLog(t *testing.T, path string) []logLine {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []logLine
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		// zapcore.ISO8601TimeEncoder's layout.
		l.Time, _ = time.Parse("2006-01-02T15:04:05.000Z0700", l.TS)
		out = append(out, l)
	}
	return out
}

// find returns the first line with the message (and source, if given).
func find(lines []logLine, msg, source string) (logLine, bool) {
	for _, l := range lines {
		if l.Msg == msg && (source == "" || l.Source == source) {
			return l, true
		}
	}
	return logLine{}, false
}

func scrape(g Gomega, url string) map[string]*dto.MetricFamily {
	resp, err := http.Get(url)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	g.Expect(err).NotTo(HaveOccurred())
	return families
}

// gauge returns the value of the series of family name whose label has
// value, a gauge's or a counter's; -1 when there is none.
func gauge(families map[string]*dto.MetricFamily, name, label, value string) float64 {
	f, ok := families[name]
	if !ok {
		return -1
	}
	for _, m := range f.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label && lp.GetValue() == value {
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

func get(g Gomega, url string) string {
	resp, err := http.Get(url)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK), "%s", b)
	return string(b)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
