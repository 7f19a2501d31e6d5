package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpuhealth/gpuhealth/e2e/framework"
)

// operator is one run of the gpuhealth-operator binary, launched and
// stopped by the framework (framework.NewOperatorWith).
type operator struct {
	*framework.Process
	// dir holds its token kubeconfig, removed on stop, and its log, kept
	// after the run.
	dir string
	// metricsURL is its /metrics; pprofURL the root of Go's pprof
	// endpoints.
	metricsURL, pprofURL string
}

// startOperator starts the operator as the gpuhealth-operator service
// account, as the only replica (no leader election), with pprof, JSON logs
// as the chart's operator writes them, and -operator-workers,
// -operator-qps, -operator-args and -operator-memory-limit. It does not
// wait for the operator to be ready. Should the operator exit before stop,
// cancel ends the run with the reason.
func (h *harness) startOperator(ctx context.Context, cancel context.CancelCauseFunc) (*operator, error) {
	o := h.o
	dir, err := os.MkdirTemp("", "gpuhealth-bench-operator-")
	if err != nil {
		return nil, err
	}
	args := []string{"--workers", fmt.Sprint(o.operatorWorkers), "--kube-api-qps", fmt.Sprint(o.operatorQPS), "--kube-api-burst", fmt.Sprint(2 * o.operatorQPS)}
	p, err := framework.NewOperatorWith(ctx, h.c, o.operatorBin, dir, framework.OperatorOptions{
		Args:             append(args, strings.Fields(o.operatorArgs)...),
		NoLeaderElection: true,
		JSONLogs:         true,
		Pprof:            true,
		MemoryLimit:      int64(math.Round(o.operatorMemLimit)),
		// A benchmark killed halfway leaves no operator behind, and
		// Ctrl-C reaches only the benchmark, which stops the operator
		// before it deletes the cluster.
		DieWithParent: true,
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	op := &operator{Process: p, dir: dir, metricsURL: "http://" + p.Metrics + "/metrics", pprofURL: "http://" + p.Pprof + "/debug/pprof"}
	p.OnExit = func(err error) {
		why := "exit status 0"
		if err != nil {
			why = err.Error()
		}
		cancel(fmt.Errorf("the operator exited unexpectedly (%s); its log %s ends:\n%s", why, op.LogPath, op.logTail(3000)))
	}
	if err := p.Launch(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return op, nil
}

// stop ends the operator (SIGTERM, then SIGKILL after a grace period) and
// removes everything of it but its log. Calls after the first do nothing
// more.
func (op *operator) stop() {
	op.Stop()
	entries, _ := os.ReadDir(op.dir)
	for _, e := range entries {
		if path := filepath.Join(op.dir, e.Name()); path != op.LogPath {
			_ = os.RemoveAll(path)
		}
	}
}

// waitReady waits until the operator's /readyz answers 200; should the
// operator exit meanwhile, the error says why.
func (op *operator) waitReady(ctx context.Context, timeout time.Duration) error {
	if err := op.WaitReady(ctx, timeout); err != nil {
		if cause := context.Cause(ctx); cause != nil {
			return cause
		}
		return fmt.Errorf("the operator is not ready: %w; see %s", err, op.LogPath)
	}
	return nil
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
	b, err := os.ReadFile(op.LogPath)
	if err != nil {
		return err.Error()
	}
	return framework.Tail(b, n)
}

// logErrors counts the error lines in the operator's log: those of the run,
// with the first of them, and the "context canceled" ones of reconciles that
// its shutdown interrupted.
func (op *operator) logErrors() (run int, first string, shutdown int) {
	f, err := os.Open(op.LogPath)
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

// cacheSynced is how long after its start the operator's last controller
// so far started its workers, which controller-runtime does once that
// controller's caches have synced ("Starting workers" in the log), and
// how many controllers have.
func (op *operator) cacheSynced() (time.Duration, int) {
	return cacheSynced(op.LogPath, op.Started())
}

// cacheSynced is operator.cacheSynced for the log at logPath of an
// operator started at started.
func cacheSynced(logPath string, started time.Time) (time.Duration, int) {
	b, err := os.ReadFile(logPath)
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
	return last.Sub(started), n
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
