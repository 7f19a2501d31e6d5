package framework

import (
	"context"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// memoryLimitEnv is where the operator reads its container's memory limit
// (the chart fills it from resources.limits.memory).
const memoryLimitEnv = "GPUHEALTH_MEMORY_LIMIT"

// OperatorOptions change how NewOperatorWith runs the operator. The zero
// value is NewOperator's: leader election on, development (console) logs,
// no pprof endpoints, no memory limit.
type OperatorOptions struct {
	// Args are extra flags; they follow the framework's own, so a flag
	// given again here wins.
	Args []string
	// NoLeaderElection runs it with --leader-elect=false, as the only
	// replica: it acts as soon as its caches have synced, without first
	// acquiring the Lease.
	NoLeaderElection bool
	// JSONLogs leaves out --zap-devel, so it logs as the chart's operator
	// does: JSON lines whose "ts" is seconds since the epoch.
	JSONLogs bool
	// Pprof serves Go's pprof endpoints on a free port (Process.Pprof).
	Pprof bool
	// MemoryLimit is the container memory limit the operator is told of,
	// in bytes, through GPUHEALTH_MEMORY_LIMIT, as the chart passes
	// resources.limits.memory. Zero: none. A value in this program's own
	// environment is never passed on.
	MemoryLimit int64
	// DieWithParent has the kernel kill the operator should this program
	// die without stopping it (Linux only), and keeps a terminal's Ctrl-C
	// from reaching it, so that this program stops it in its own time
	// (before it deletes the cluster, say).
	DieWithParent bool
}

// NewOperator prepares the operator as a host process authenticated as the
// gpuhealth-operator service account (config/rbac), so missing RBAC fails;
// extra flags follow the framework's own.
func NewOperator(ctx context.Context, c *Cluster, bin, dir string, extra ...string) (*Process, error) {
	return NewOperatorWith(ctx, c, bin, dir, OperatorOptions{Args: extra})
}

// NewOperatorWith is NewOperator with options. Its token kubeconfig and
// its log (operator.log) go into dir.
func NewOperatorWith(ctx context.Context, c *Cluster, bin, dir string, o OperatorOptions) (*Process, error) {
	kc := filepath.Join(dir, "operator.kubeconfig")
	if err := c.TokenKubeconfig(ctx, kc, Namespace, "gpuhealth-operator", ""); err != nil {
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
	p := &Process{
		Name: "gpuhealth-operator", LogPath: filepath.Join(dir, "operator.log"), Health: health, Metrics: metrics, bin: bin,
		dieWithParent: o.DieWithParent,
	}
	// Leader election stays on unless asked (its Lease RBAC is part of what
	// the suite tests). The metrics are plain HTTP on localhost: the suites,
	// the benchmarks and the soak scrape them without a token. The Job
	// rules are the ones the chart gives the operator for the suites'
	// values (JobValues): the chart adds its own registry.
	args := []string{"--kubeconfig", kc, "--namespace", Namespace, "--leader-elect=" + strconv.FormatBool(!o.NoLeaderElection),
		"--health-probe-bind-address", health, "--metrics-bind-address", metrics, "--metrics-secure=false",
		"--job-image-prefixes=" + strings.Join(append(slices.Clone(JobImagePrefixes), "ghcr.io/gpuhealth/"), ",")}
	if o.Pprof {
		if p.Pprof, err = FreeAddr(); err != nil {
			return nil, err
		}
		args = append(args, "--pprof-bind-address", p.Pprof)
	}
	if !o.JSONLogs {
		args = append(args, "--zap-devel")
	}
	args = append(args, o.Args...)
	p.args = args
	for _, e := range baseEnv() {
		if !strings.HasPrefix(e, memoryLimitEnv+"=") {
			p.env = append(p.env, e)
		}
	}
	if o.MemoryLimit > 0 {
		p.env = append(p.env, memoryLimitEnv+"="+strconv.FormatInt(o.MemoryLimit, 10))
	}
	return p, nil
}
