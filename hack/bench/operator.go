package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// memoryLimitEnv is where the operator reads its container's memory limit
// (the chart fills it from resources.limits.memory).
const memoryLimitEnv = "GPUHEALTH_MEMORY_LIMIT"

// operator is the gpuhealth-operator child process.
type operator struct {
	cmd        *exec.Cmd
	dir        string // holds the token kubeconfig; removed on stop
	logPath    string // kept after the run
	logFile    *os.File
	metricsURL string
	probeURL   string
	pprofURL   string // Go's pprof endpoints
	exited     chan struct{}
	// started is when the process was started.
	started  time.Time
	stopping atomic.Bool
	stopOnce sync.Once
}

// startOperator starts the operator as the gpuhealth-operator service
// account. Should it exit before stop, cancel ends the run with the reason.
func startOperator(ctx context.Context, cancel context.CancelCauseFunc, h *harness, bin string, workers int, extra []string) (*operator, error) {
	dir, err := os.MkdirTemp("", "gpuhealth-bench-")
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(dir, "operator.kubeconfig")
	if err := h.tokenKubeconfig(ctx, kubeconfig); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	logFile, err := os.CreateTemp("", "gpuhealth-bench-operator-*.log")
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	metricsAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	probeAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	pprofAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := []string{
		"--kubeconfig", kubeconfig,
		"--namespace", operatorNamespace,
		"--leader-elect=false",
		"--metrics-bind-address", metricsAddr,
		"--health-probe-bind-address", probeAddr,
		"--pprof-bind-address", pprofAddr,
		"--workers", fmt.Sprint(workers),
		"--kube-api-qps", fmt.Sprint(h.o.operatorQPS),
		"--kube-api-burst", fmt.Sprint(2 * h.o.operatorQPS),
	}
	cmd := exec.Command(bin, append(args, extra...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "KUBECONFIG=") && !strings.HasPrefix(e, memoryLimitEnv+"=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	if h.o.operatorMemLimit > 0 {
		cmd.Env = append(cmd.Env, fmt.Sprintf("%s=%.0f", memoryLimitEnv, h.o.operatorMemLimit))
	}
	setProcAttrs(cmd)
	op := &operator{
		cmd:        cmd,
		dir:        dir,
		logPath:    logFile.Name(),
		logFile:    logFile,
		metricsURL: "http://" + metricsAddr + "/metrics",
		probeURL:   "http://" + probeAddr + "/readyz",
		pprofURL:   "http://" + pprofAddr + "/debug/pprof",
		exited:     make(chan struct{}),
	}
	op.started = time.Now()
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	go func() {
		err := cmd.Wait()
		close(op.exited)
		if !op.stopping.Load() {
			why := "exit status 0"
			if err != nil {
				why = err.Error()
			}
			cancel(fmt.Errorf("the operator exited unexpectedly (%s); its log %s ends:\n%s", why, op.logPath, op.logTail(3000)))
		}
	}()
	return op, nil
}

// stop ends the operator: SIGTERM, then SIGKILL after 10 seconds. Calls
// after the first do nothing.
func (op *operator) stop() { op.stopOnce.Do(op.doStop) }

func (op *operator) doStop() {
	op.stopping.Store(true)
	select {
	case <-op.exited:
	default:
		_ = op.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-op.exited:
		case <-time.After(10 * time.Second):
			logf("WARNING: the operator ignored SIGTERM for 10s; killing it")
			_ = op.cmd.Process.Kill()
			<-op.exited
		}
	}
	_ = op.logFile.Close()
	_ = os.RemoveAll(op.dir)
}

// waitReady waits until the operator's /readyz answers 200.
func (op *operator) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	hc := &http.Client{Timeout: 2 * time.Second}
	var last string
	for {
		resp, err := hc.Get(op.probeURL)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the operator is not ready after %s (%s); see %s", timeout, last, op.logPath)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// metrics returns the operator's Prometheus metrics text.
func (op *operator) metrics(ctx context.Context) ([]byte, error) {
	return op.get(ctx, op.metricsURL, "metrics")
}

// heapProfile returns the operator's heap profile, taken after a garbage
// collection, for go tool pprof.
func (op *operator) heapProfile(ctx context.Context) ([]byte, error) {
	return op.get(ctx, op.pprofURL+"/heap?gc=1", "heap profile")
}

func (op *operator) get(ctx context.Context, url, what string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading the operator's %s: %w", what, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading the operator's %s: %s", what, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// logTail returns about the last n bytes of the operator's log.
func (op *operator) logTail(n int) string {
	b, err := os.ReadFile(op.logPath)
	if err != nil {
		return err.Error()
	}
	return tail(b, n)
}

// logErrors counts the error lines in the operator's log: those of the run,
// with the first of them, and the "context canceled" ones of reconciles that
// its shutdown interrupted.
func (op *operator) logErrors() (run int, first string, shutdown int) {
	f, err := os.Open(op.logPath)
	if err != nil {
		return 0, "", 0
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `"level":"error"`) && !strings.Contains(line, "\tERROR\t") {
			continue
		}
		if strings.Contains(line, "context canceled") {
			shutdown++
			continue
		}
		if run == 0 {
			first = line
		}
		run++
	}
	return run, first, shutdown
}

// freeAddr returns a localhost address with a port that was free a moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// cacheSynced is how long after its start the operator's last controller
// so far started its workers, which controller-runtime does once that
// controller's caches have synced ("Starting workers" in the log), and
// how many controllers have.
func (op *operator) cacheSynced() (time.Duration, int) {
	b, err := os.ReadFile(op.logPath)
	if err != nil {
		return 0, 0
	}
	var last time.Time
	n := 0
	for line := range strings.Lines(string(b)) {
		if !strings.Contains(line, `"msg":"Starting workers"`) {
			continue
		}
		var entry struct {
			TS json.RawMessage `json:"ts"`
		}
		if json.Unmarshal([]byte(line), &entry) != nil {
			continue
		}
		t, ok := logTime(entry.TS)
		if !ok {
			continue
		}
		n++
		if t.After(last) {
			last = t
		}
	}
	if n == 0 {
		return 0, 0
	}
	return last.Sub(op.started), n
}

// logTime reads a zap "ts": seconds since the epoch (the production
// encoder) or an RFC 3339 string.
func logTime(raw json.RawMessage) (time.Time, bool) {
	var f float64
	if json.Unmarshal(raw, &f) == nil && f > 0 {
		sec, frac := math.Modf(f)
		return time.Unix(int64(sec), int64(frac*1e9)), true
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}

// writeHeapProfile saves the operator's heap profile, after a collection,
// to path.
func writeHeapProfile(ctx context.Context, op *operator, o *options, path string) error {
	prof, err := op.heapProfile(ctx)
	if err != nil {
		return err
	}
	return saveProfile(o, path, prof)
}

// saveProfile writes a heap profile of the operator to path; with several
// -nodes sizes, "-N" goes before the extension.
func saveProfile(o *options, path string, prof []byte) error {
	if len(o.sizes) > 1 {
		ext := filepath.Ext(path)
		path = fmt.Sprintf("%s-%d%s", strings.TrimSuffix(path, ext), o.nodes, ext)
	}
	if err := os.WriteFile(path, prof, 0o644); err != nil {
		return err
	}
	logf("heap profile of the operator written to %s (go tool pprof -top %s)", path, path)
	return nil
}
