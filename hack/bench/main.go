// Command bench measures how fast gpuhealth cordons GPU nodes and prints the
// comparison published in docs/performance.md. In one run, on one throwaway
// kwok cluster (fake nodes, real kube-apiserver, etcd and controllers), it
// measures:
//
//   - raw: a plain client-go loop, 16 workers and no client-side rate limit,
//     merge-patches spec.unschedulable=true on all N nodes. This is what the
//     apiserver allows; nothing that cordons through it can be faster.
//   - operator burst: the gpuhealth-operator binary runs as a child process
//     with its service account's RBAC and manages the N nodes through a
//     RemediationPolicy (maxUnavailable 0: quarantine only, no drain, and the
//     circuit breaker off, since a burst of N quarantines is exactly what it
//     stops). The harness creates N Fatal XID 79 NodeHealthEvents at once and
//     times the first create until a node watch has seen every node cordoned;
//     it reports nodes/s and the ratio to raw.
//   - API writes per node: the apiserver's apiserver_request_total (write
//     verbs, per resource) just before the burst and once every NodeHealth is
//     Quarantined, less the harness's own N creates, divided by N. The
//     operator's own client count (rest_client_requests_total) is shown too.
//   - single-event latency: K fresh nodes are added at steady state and one
//     event at a time is created for one of them; creation to cordon seen in
//     the watch, as p50, p90, p99 and max.
//   - backlog (-backlog): N more fresh nodes; with the operator stopped the
//     harness creates one event per node (timed: the creates alone), then
//     starts a new operator process and times its start until every one of
//     those nodes is seen cordoned — a restart after an outage, and the
//     operator's throughput apart from the harness's creation rate.
//
// Run it from the repository root (it builds the operator and finds the
// control-plane binaries itself):
//
//	go run ./hack/bench -nodes 1000
//	make bench NODES=1000
//
// It prints a Markdown table for docs/performance.md on stdout (and to -out),
// progress on stderr, and keeps the operator's log in a temporary file. The
// cluster is deleted at the end, also on error or Ctrl-C; every wait has a
// deadline (-timeout).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// options are the command-line flags.
type options struct {
	nodes           int
	latencySamples  int
	workers         int
	operatorWorkers int
	timeout         time.Duration
	out             string
	operatorBin     string
	build           bool
	controlPlane    string
	keep            bool
	backlog         bool
	operatorArgs    string
}

func main() {
	var o options
	flag.IntVar(&o.nodes, "nodes", 1000, "Number of fake GPU nodes (N).")
	flag.IntVar(&o.latencySamples, "latency-samples", 100, "Fresh nodes added for the single-event latency samples (K); 0 skips that part.")
	flag.IntVar(&o.workers, "workers", 16, "Parallel requests of the harness (raw cordon, labels, event creates).")
	flag.IntVar(&o.operatorWorkers, "operator-workers", 16, "The operator's --workers.")
	flag.DurationVar(&o.timeout, "timeout", 10*time.Minute, "Deadline of each wait (cluster start, nodes, steady state, burst, each latency sample).")
	flag.StringVar(&o.out, "out", "", "Also write the Markdown table to this file.")
	flag.StringVar(&o.operatorBin, "operator", "_output/bin/gpuhealth-operator", "Operator binary, relative to the repository root.")
	flag.BoolVar(&o.build, "build", true, "Run 'make build-operator' first (a no-op when the binary is up to date).")
	flag.StringVar(&o.controlPlane, "controlplane", "", "Directory of kwokctl, kwok, etcd and kube-* binaries (default: the last line of hack/controlplane.sh).")
	flag.StringVar(&o.operatorArgs, "operator-args", "", "Extra flags for the operator, space-separated (e.g. \"--storm-quiet=0\" to compare a setting side by side).")
	flag.BoolVar(&o.backlog, "backlog", true, "Also measure the backlog case on N fresh nodes: N events created with the operator stopped, then the operator started.")
	flag.BoolVar(&o.keep, "keep", false, "Leave the cluster running at the end (for debugging; delete it with kwokctl delete cluster --name NAME).")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: go run ./hack/bench [flags]\n\nCordon-speed benchmark of gpuhealth-operator on a local kwok cluster.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "bench: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if o.nodes < 1 || o.latencySamples < 0 || o.workers < 1 || o.operatorWorkers < 1 || o.timeout <= 0 {
		fmt.Fprintln(os.Stderr, "bench: -nodes, -workers and -operator-workers must be positive, -latency-samples non-negative and -timeout positive")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

// run does the whole benchmark; its deferred cleanups delete the cluster and
// stop the operator whatever happens.
func run(sigCtx context.Context, o options) (err error) {
	start := time.Now()
	root, err := repoRoot()
	if err != nil {
		return err
	}
	if err := os.Chdir(root); err != nil {
		return err
	}

	// The operator's unexpected exit cancels ctx with its cause, so that
	// every wait and request ends at once with the reason.
	ctx, cancel := context.WithCancelCause(sigCtx)
	defer cancel(nil)

	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()

	binDir := o.controlPlane
	if binDir == "" {
		logf("finding control-plane binaries (hack/controlplane.sh)")
		if binDir, err = controlPlaneDir(ctx); err != nil {
			return err
		}
	}
	operatorBin, err := filepath.Abs(o.operatorBin)
	if err != nil {
		return err
	}
	if o.build {
		logf("building the operator (make build-operator)")
		if err := runTo(ctx, os.Stderr, "make", "build-operator"); err != nil {
			return fmt.Errorf("make build-operator: %w", err)
		}
	}
	if st, err := os.Stat(operatorBin); err != nil {
		return fmt.Errorf("operator binary missing (did make build-operator produce it?): %w", err)
	} else if st.IsDir() {
		return fmt.Errorf("operator binary %s is a directory", operatorBin)
	}

	c, err := newCluster(binDir)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() {
		if o.keep {
			logf("leaving cluster %s running (-keep); admin kubeconfig %s; delete it with: %s delete cluster --name %s", c.name, c.adminKubeconfig, c.kwokctlPath(), c.name)
			return
		}
		logf("deleting cluster %s", c.name)
		dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer dcancel()
		if derr := c.delete(dctx); derr != nil {
			logf("WARNING: deleting cluster %s: %v (remove it with: %s delete cluster --name %s)", c.name, derr, c.kwokctlPath(), c.name)
		}
	})
	logf("creating kwok cluster %s", c.name)
	if err := c.create(ctx, o.timeout); err != nil {
		return err
	}
	h, err := newHarness(ctx, c, o)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, h.stopWatches)

	res := &results{
		Command:         commandLine(),
		Date:            start,
		N:               o.nodes,
		K:               o.latencySamples,
		HarnessWorkers:  o.workers,
		OperatorWorkers: o.operatorWorkers,
	}
	res.fillEnvironment(ctx, h)

	nodes, err := h.addNodes(ctx, o.nodes)
	if err != nil {
		return err
	}
	logf("applying manifests (namespace, CRDs, RBAC)")
	if err := h.applyManifests(ctx); err != nil {
		return err
	}

	// 1. Raw client-go cordon.
	logf("raw: cordoning %d nodes with %d unthrottled client-go workers", len(nodes), o.workers)
	if res.Raw, err = h.rawCordon(ctx, nodes, res); err != nil {
		return err
	}
	logf("raw: %d nodes cordoned in %s; uncordoning", len(nodes), res.Raw.Round(time.Millisecond))
	if err := h.uncordon(ctx, nodes); err != nil {
		return err
	}

	// 2. Operator at steady state.
	logf("creating RemediationPolicy %s", policyName)
	if err := h.createPolicy(ctx); err != nil {
		return err
	}
	startOp := func() (*operator, error) {
		op, err := startOperator(ctx, cancel, h, operatorBin, o.operatorWorkers, strings.Fields(o.operatorArgs))
		if err != nil {
			return nil, err
		}
		cleanups = append(cleanups, op.stop)
		res.OperatorLog = op.logPath
		logf("operator started (pid %d, log %s)", op.cmd.Process.Pid, op.logPath)
		return op, nil
	}
	op, err := startOp()
	if err != nil {
		return err
	}
	logf("waiting for %d NodeHealths Healthy", len(nodes))
	if err := op.waitReady(ctx, o.timeout); err != nil {
		return err
	}
	if err := h.waitPhase(ctx, nodes, phaseHealthy); err != nil {
		return err
	}

	// 3. The burst, and the writes it took.
	logf("burst: creating %d NodeHealthEvents at once", len(nodes))
	if err := h.burst(ctx, op, nodes, res); err != nil {
		return err
	}
	logf("burst: %d nodes cordoned in %s (%.2fx raw)", len(nodes), res.Operator.Round(time.Millisecond), res.ratio())

	// 4. Single-event latency on fresh nodes.
	used := nodes
	if o.latencySamples > 0 {
		logf("latency: adding %d fresh nodes", o.latencySamples)
		all, err := h.addNodes(ctx, len(used)+o.latencySamples)
		if err != nil {
			return err
		}
		fresh := without(all, used)
		used = all
		if len(fresh) != o.latencySamples {
			return fmt.Errorf("latency: expected %d fresh nodes, found %d", o.latencySamples, len(fresh))
		}
		if err := h.waitPhase(ctx, fresh, phaseHealthy); err != nil {
			return err
		}
		logf("latency: %d single events, one at a time", len(fresh))
		if res.Latency, err = h.latency(ctx, fresh); err != nil {
			return err
		}
		ms := make([]string, len(res.Latency))
		for i, d := range res.Latency {
			ms[i] = fmt.Sprintf("%.0f", float64(d)/float64(time.Millisecond))
		}
		logf("latency samples in order, ms: %s", strings.Join(ms, " "))
	}

	// 5. The backlog: N events waiting when the operator starts.
	if o.backlog {
		logf("backlog: adding %d fresh nodes", o.nodes)
		all, err := h.addNodes(ctx, len(used)+o.nodes)
		if err != nil {
			return err
		}
		fresh := without(all, used)
		if err := h.waitPhase(ctx, fresh, phaseHealthy); err != nil {
			return err
		}
		first := op
		stopFirst := func() {
			first.stop()
			res.addLogErrors(first)
		}
		if op, err = h.backlog(ctx, stopFirst, startOp, fresh, res); err != nil {
			return err
		}
		logf("backlog: %d nodes cordoned %s after the operator started (%.2fx raw)", len(fresh), res.Backlog.Round(time.Millisecond), ratio(res.Backlog, res.Raw))
	}

	op.stop()
	res.addLogErrors(op)
	table := res.markdown()
	fmt.Print(table)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(table), 0o644); err != nil {
			return fmt.Errorf("writing -out: %w", err)
		}
		logf("wrote %s", o.out)
	}
	logf("operator log: %s (%d error lines, %d more of reconciles cut short by its shutdown)", op.logPath, res.OperatorErrors, res.OperatorShutdownErrors)
	if res.OperatorErrors > 0 {
		logf("  first: %s", firstBytes(res.OperatorErrorSample, 600))
	}
	logf("done in %s", time.Since(start).Round(time.Second))
	return nil
}

// repoRoot walks up from the working directory to the gpuhealth module root.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/gpuhealth/gpuhealth\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run the benchmark inside the gpuhealth repository (no go.mod of github.com/gpuhealth/gpuhealth above the working directory)")
		}
		dir = parent
	}
}

// commandLine is how this run was invoked, as a user would type it.
func commandLine() string {
	args := []string{"go", "run", "./hack/bench"}
	for _, a := range os.Args[1:] {
		if strings.ContainsAny(a, " \t\"'$`\\") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		args = append(args, a)
	}
	return strings.Join(args, " ")
}

// without returns the names in all that are not in some.
func without(all, some []string) []string {
	skip := make(map[string]bool, len(some))
	for _, s := range some {
		skip[s] = true
	}
	var out []string
	for _, a := range all {
		if !skip[a] {
			out = append(out, a)
		}
	}
	return out
}

// firstBytes returns at most the first n bytes of s.
func firstBytes(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

var logStart = time.Now()

// logf prints a progress line to stderr, stamped with the time since start.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[bench %6.1fs] %s\n", time.Since(logStart).Seconds(), fmt.Sprintf(format, args...))
}
