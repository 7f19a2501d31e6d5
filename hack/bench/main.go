// Command bench measures how fast gpuhealth cordons and drains GPU nodes
// and prints the comparisons published in docs/performance.md. Each size
// (-nodes 1000, or a list such as 1000,2000,5000,10000 for the scale
// curve) runs on its own throwaway kwok cluster (fake nodes, real
// kube-apiserver, etcd and controllers) with -pods-per-node workload pods
// on each of its N GPU nodes (bound by the harness; -schedule-pods places
// them through a Deployment and kube-scheduler), and measures, each on
// fresh nodes so no phase waits for another's leftovers:
//
//   - raw: a plain client-go loop, 16 workers and no client-side rate limit,
//     merge-patches spec.unschedulable=true on N nodes of its own (deleted
//     after). This is what the apiserver allows; nothing that cordons
//     through it can be faster.
//   - steady state: the gpuhealth-operator binary runs as a child process
//     with its service account's RBAC and manages the N nodes through a
//     RemediationPolicy (maxUnavailable 0: quarantine only, no drain, and the
//     circuit breaker off, since a burst of N quarantines is exactly what it
//     stops); its cache sync time, idle CPU and the memory of every
//     process; its live heap (a collection forced) and RSS per 1,000
//     nodes; and what the apiserver sent from its start until steady
//     state, LIST responses and watch events by resource.
//   - operator burst: N Fatal XID 79 NodeHealthEvents created at once, timed
//     from the first create until a node watch has seen every node
//     cordoned, and for each node from its own event's create to its
//     cordon (p50, p90, p99, max); the ratio to the floor (the creates
//     alone and the raw loop), and the API writes and bytes written
//     (apiserver_request_total and the request body size histogram) per
//     Healthy → Quarantined transition.
//   - single-event latency: K fresh nodes, one event at a time, creation to
//     cordon seen in the watch, as p50, p90, p99 and max.
//   - detection to cordon (-detect-samples): real gpuhealth-monitor processes
//     with the fake NVML library on fresh nodes, one XID at a time scheduled
//     in the scenario, to the node seen cordoned.
//   - fault wave (-wave): fresh nodes full of a Deployment's pods under a
//     PDB, with spares, managed by a second policy that drains (the bench
//     policy selects none of them, nor this one any of the others); one
//     Fatal finding per node at once, each node timed from its finding's
//     create to the node seen without workload pods, and the whole wave.
//   - backlog (-backlog, up to -backlog-max-nodes): N more fresh nodes; with
//     the operator stopped the harness creates one event per node (timed:
//     the creates alone), then starts a new operator process and times its
//     start until every one of those nodes is seen cordoned — a restart
//     after an outage.
//
// -drain runs the drain race instead: on three identical fresh node sets in
// one cluster (victims full of a Deployment's pods under a PDB, spares for
// the replacements), gpuhealth with the sample policy's eviction limits,
// gpuhealth with raised limits, and kubectl drain -l.
//
// Run it from the repository root (it builds the operator and finds the
// control-plane binaries itself):
//
//	go run ./hack/bench -nodes 1000
//	make bench NODES=1000
//	make bench-scale     # 1,000, 2,000 and 5,000 nodes; draws docs/scale.png
//	go run ./hack/bench -nodes 10000 -pods-per-node 1   # the backlog skipped (-backlog-max-nodes)
//	make bench-drain
//
// It prints Markdown tables for docs/performance.md on stdout (and to -out),
// progress on stderr, and keeps the operator's log in a temporary file. Each
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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/resource"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/gpuhealth/gpuhealth/e2e/framework"
)

// options are the command-line flags.
type options struct {
	sizes           []int
	nodes           int // the N of the run under way
	podsPerNode     int
	schedulePods    bool
	idle            time.Duration
	latencySamples  int
	detectSamples   int
	detectMonitors  int
	workers         int
	operatorWorkers int
	operatorQPS     int
	timeout         time.Duration
	out             string
	plot            string
	heapProfile     string
	operatorBin     string
	build           bool
	controlPlane    string
	keep            bool
	backlog         bool
	drain           bool
	drainNodes      int
	drainPods       int
	operatorArgs    string
	// operatorMemLimit is the container memory limit the operator is told
	// of (bytes; 0: none), as the chart passes resources.limits.memory.
	operatorMemLimit float64

	// backlogMaxNodes skips the backlog at larger N (0: no limit).
	backlogMaxNodes int
	// wave is the fault wave's nodes (0: skipped), wavePods the pods on
	// each, and the eviction limits its policy drains them with.
	wave                       int
	wavePods                   int
	waveEvictionsPerSecond     int
	waveMaxConcurrentEvictions int
}

func main() {
	var o options
	var sizes string
	flag.StringVar(&sizes, "nodes", "1000", "Number of fake GPU nodes (N); a comma-separated list (1000,2000,5000) runs each size on its own fresh cluster and draws the scale curve.")
	flag.IntVar(&o.podsPerNode, "pods-per-node", 10, "Workload pods on each of the N nodes (bound by the harness, or placed by kube-scheduler with -schedule-pods); 0 for none.")
	flag.BoolVar(&o.schedulePods, "schedule-pods", false, "Place the workload pods through a Deployment and kube-scheduler instead of binding them from the harness (on two cores: about 3 minutes for 10,000 pods, over 15 for 20,000).")
	flag.DurationVar(&o.idle, "idle", 15*time.Second, "How long every process's idle CPU is measured at steady state; 0 skips it.")
	flag.IntVar(&o.latencySamples, "latency-samples", 100, "Fresh nodes added for the single-event latency samples (K); 0 skips that part.")
	flag.IntVar(&o.detectSamples, "detect-samples", 50, "XIDs injected through real gpuhealth-monitor processes (fake NVML), one at a time, each timed to its node cordoned; 0 skips that part.")
	flag.IntVar(&o.detectMonitors, "detect-monitors", 10, "Monitor processes running at once for -detect-samples (each on its own fresh node, one XID each).")
	flag.IntVar(&o.workers, "workers", 16, "Parallel requests of the harness (raw cordon, node and event creates).")
	flag.IntVar(&o.operatorWorkers, "operator-workers", 16, "The operator's --workers.")
	flag.IntVar(&o.operatorQPS, "operator-qps", 500, "The operator's --kube-api-qps (its burst twice that). The chart's default, 50, creates the NodeHealths of 5,000 fresh nodes in about five minutes; a cluster that size raises it.")
	flag.DurationVar(&o.timeout, "timeout", 10*time.Minute, "Deadline of each wait (cluster start, nodes, steady state, burst, each latency sample); a wait that reports progress (nodes Ready, pods Running) restarts it at each step.")
	flag.StringVar(&o.out, "out", "", "Also write the Markdown tables to this file.")
	flag.StringVar(&o.plot, "plot", "", "Draw the scale curve into this PNG (with more than one -nodes size): against N, the time to cordon every node, peak memory, each node's finding → cordon (burst) and → drained (wave), the operator's memory per 1,000 nodes, and API writes and bytes per transition.")
	flag.StringVar(&o.heapProfile, "heap-profile", "", "Write the operator's heap profile at steady state (after the idle window) to this file, for go tool pprof, and two more beside it: FILE-burst after the burst, FILE-peak as the heap stood (no collection forced) at the burst's highest RSS; with several -nodes sizes, N is appended to the names.")
	flag.StringVar(&o.operatorBin, "operator", "_output/bin/gpuhealth-operator", "Operator binary, relative to the repository root.")
	flag.BoolVar(&o.build, "build", true, "Run 'make build-operator' first (a no-op when the binary is up to date).")
	flag.StringVar(&o.controlPlane, "controlplane", "", "Directory of kwokctl, kwok, etcd and kube-* binaries (default: the last line of hack/controlplane.sh).")
	flag.StringVar(&o.operatorArgs, "operator-args", "", "Extra flags for the operator, space-separated (e.g. \"--storm-quiet=0\" to compare a setting side by side).")
	var memLimit string
	flag.StringVar(&memLimit, "operator-memory-limit", "", "Tell the operator it runs under this container memory limit (e.g. 200Mi), as the chart does from resources.limits.memory; its soft memory limit is then --memory-limit-ratio (0.9) of it. Empty: no limit, the Go runtime's default.")
	flag.BoolVar(&o.backlog, "backlog", true, "Also measure the backlog case on N fresh nodes: N events created with the operator stopped, then the operator started.")
	flag.IntVar(&o.backlogMaxNodes, "backlog-max-nodes", 5000, "Skip the backlog at sizes above this N: it adds N more nodes, so at 10,000 the cluster would hold over 20,000; 0 for no limit. The scale tables note the sizes it skipped.")
	flag.IntVar(&o.wave, "wave", 100, "Nodes in the fault wave: fresh nodes, each full of -wave-pods pods of one Deployment under a PodDisruptionBudget (10%), with as many spare nodes, drained by a second policy (maxUnavailable 100%); one Fatal finding per node at once, each timed to its node seen without workload pods; 0 skips it.")
	flag.IntVar(&o.wavePods, "wave-pods", 10, "Workload pods on each node of the fault wave.")
	flag.IntVar(&o.waveEvictionsPerSecond, "wave-evictions-per-second", 20, "The fault wave's policy's drain.evictionsPerSecond (the sample policy's 20; at most 1000).")
	flag.IntVar(&o.waveMaxConcurrentEvictions, "wave-max-concurrent-evictions", 16, "The fault wave's policy's drain.maxConcurrentEvictions (the sample policy's 16; at most 1000).")
	flag.BoolVar(&o.drain, "drain", false, "Run the drain race instead: gpuhealth (the sample policy's eviction limits, then raised ones) against kubectl drain -l, each on its own fresh node set.")
	flag.IntVar(&o.drainNodes, "drain-nodes", 20, "Nodes drained in each set of the drain race (as many spare nodes take the replacements).")
	flag.IntVar(&o.drainPods, "drain-pods", 10, "Workload pods on each drained node in the drain race.")
	flag.BoolVar(&o.keep, "keep", false, "Leave the cluster running at the end (for debugging; delete it with kwokctl delete cluster --name NAME).")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: go run ./hack/bench [flags]\n\nCordon- and drain-speed benchmark of gpuhealth-operator on a local kwok cluster.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "bench: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if memLimit != "" {
		q, err := resource.ParseQuantity(memLimit)
		if err != nil || q.Sign() <= 0 {
			fmt.Fprintf(os.Stderr, "bench: -operator-memory-limit: %q is not a positive memory size\n", memLimit)
			os.Exit(2)
		}
		o.operatorMemLimit = q.AsApproximateFloat64()
	}
	for _, f := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bench: -nodes: %q is not a positive number of nodes\n", f)
			os.Exit(2)
		}
		o.sizes = append(o.sizes, n)
	}
	if o.podsPerNode < 0 || o.latencySamples < 0 || o.detectSamples < 0 || o.detectMonitors < 1 || o.workers < 1 || o.operatorWorkers < 1 || o.operatorQPS < 1 || o.timeout <= 0 || o.idle < 0 || o.drainNodes < 1 || o.drainPods < 1 ||
		o.backlogMaxNodes < 0 || o.wave < 0 || o.wavePods < 1 {
		fmt.Fprintln(os.Stderr, "bench: -workers, -operator-workers, -operator-qps, -detect-monitors, -drain-nodes, -drain-pods, -wave-pods and -timeout must be positive; -pods-per-node, -latency-samples, -detect-samples, -idle, -wave and -backlog-max-nodes non-negative")
		os.Exit(2)
	}
	if o.waveEvictionsPerSecond < 1 || o.waveEvictionsPerSecond > 1000 || o.waveMaxConcurrentEvictions < 1 || o.waveMaxConcurrentEvictions > 1000 {
		fmt.Fprintln(os.Stderr, "bench: -wave-evictions-per-second and -wave-max-concurrent-evictions must be from 1 to 1000, as the policy's schema allows")
		os.Exit(2)
	}

	// The harness's controller-runtime client logs nothing worth showing.
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

// run prepares the binaries and runs the drain race or each size's cordon
// benchmark, each on its own cluster, then prints the tables.
func run(ctx context.Context, o options) error {
	start := time.Now()
	root, err := repoRoot()
	if err != nil {
		return err
	}
	if err := os.Chdir(root); err != nil {
		return err
	}
	if o.controlPlane == "" {
		logf("finding control-plane binaries (hack/controlplane.sh)")
		if o.controlPlane, err = framework.ControlPlane(ctx, root); err != nil {
			return err
		}
	}
	if o.operatorBin, err = filepath.Abs(o.operatorBin); err != nil {
		return err
	}
	if o.build {
		logf("building the operator (make build-operator)")
		if err := runTo(ctx, os.Stderr, "make", "build-operator"); err != nil {
			return fmt.Errorf("make build-operator: %w", err)
		}
	}
	if st, err := os.Stat(o.operatorBin); err != nil {
		return fmt.Errorf("operator binary missing (did make build-operator produce it?): %w", err)
	} else if st.IsDir() {
		return fmt.Errorf("operator binary %s is a directory", o.operatorBin)
	}
	setOperatorBinary(o.operatorBin)

	var table string
	if o.drain {
		res, err := withCluster(ctx, root, o, func(ctx context.Context, h *harness, cancel context.CancelCauseFunc, cleanup func(func())) (*drainResults, error) {
			return h.drainRace(ctx, cancel, cleanup)
		})
		if err != nil {
			return err
		}
		res.Command, res.Date = commandLine(), start
		table = res.markdown()
	} else {
		var all []*results
		for _, n := range o.sizes {
			o.nodes = n
			logf("=== N = %d ===", n)
			res, err := withCluster(ctx, root, o, func(ctx context.Context, h *harness, cancel context.CancelCauseFunc, cleanup func(func())) (*results, error) {
				return h.cordonBench(ctx, cancel, cleanup)
			})
			if err != nil {
				return fmt.Errorf("the run with %d nodes: %w", n, err)
			}
			res.Date = start
			all = append(all, res)
			table += res.markdown() + "\n"
			if err := writeOut(o.out, table); err != nil {
				return err
			}
		}
		if len(all) > 1 {
			table = curveMarkdown(all) + "\n" + table
			if o.plot != "" {
				if err := plotCurve(all, o.plot); err != nil {
					return fmt.Errorf("drawing %s: %w", o.plot, err)
				}
				logf("wrote %s", o.plot)
			}
		}
	}
	fmt.Print(table)
	if err := writeOut(o.out, table); err != nil {
		return err
	}
	if o.out != "" {
		logf("wrote %s", o.out)
	}
	logf("done in %s", time.Since(start).Round(time.Second))
	return nil
}

// withCluster creates a fresh kwok cluster, connects the harness and runs
// fn; the cleanups fn registers, and the cluster's deletion, run whatever
// happens. An unexpected exit of a process fn starts cancels ctx through
// cancel, with its cause.
func withCluster[R any](sigCtx context.Context, root string, o options, fn func(ctx context.Context, h *harness, cancel context.CancelCauseFunc, cleanup func(func())) (R, error)) (res R, err error) {
	ctx, cancel := context.WithCancelCause(sigCtx)
	defer cancel(nil)
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()
	c, err := newCluster(root, o)
	if err != nil {
		return res, err
	}
	kwokctl := filepath.Join(c.BinDir, "kwokctl")
	cleanups = append(cleanups, func() {
		if o.keep {
			logf("leaving cluster %s running (-keep); admin kubeconfig %s; delete it with: %s delete cluster --name %s", c.Name, c.Kubeconfig, kwokctl, c.Name)
			return
		}
		logf("deleting cluster %s", c.Name)
		dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer dcancel()
		if derr := c.Delete(dctx); derr != nil {
			logf("WARNING: deleting cluster %s: %v (remove it with: %s delete cluster --name %s)", c.Name, derr, kwokctl, c.Name)
		}
	})
	logf("creating kwok cluster %s", c.Name)
	if err := c.Create(ctx); err != nil {
		return res, err
	}
	h, err := newHarness(ctx, c, o)
	if err != nil {
		return res, err
	}
	cleanups = append(cleanups, h.stopWatches)
	logf("applying manifests (namespaces, CRDs, RBAC, the monitor's admission policy)")
	if err := h.applyManifests(ctx); err != nil {
		return res, err
	}
	return fn(ctx, h, cancel, func(f func()) { cleanups = append(cleanups, f) })
}

// cordonBench is one size's cordon benchmark on its own cluster.
func (h *harness) cordonBench(ctx context.Context, cancel context.CancelCauseFunc, cleanup func(func())) (*results, error) {
	o := h.o
	res := &results{
		Command:         commandLine(),
		N:               o.nodes,
		K:               o.latencySamples,
		PodsPerNode:     o.podsPerNode,
		DetectMonitors:  o.detectMonitors,
		HarnessWorkers:  o.workers,
		OperatorWorkers: o.operatorWorkers,
		Skipped:         o.skippedPhases(),
	}
	res.fillEnvironment(ctx, h)

	nodes, err := h.createNodes(ctx, nodeSet{name: "gpu", gpu: true, pods: max(o.podsPerNode, 1)}, o.nodes)
	if err != nil {
		return nil, err
	}
	if o.podsPerNode > 0 {
		start := time.Now()
		if o.schedulePods {
			if err := h.createWorkload(ctx, workload{name: "spread", set: "gpu", replicas: o.nodes * o.podsPerNode}); err != nil {
				return nil, err
			}
		} else if err := h.createBoundPods(ctx, h.podWatch(), nodes, o.podsPerNode); err != nil {
			return nil, err
		}
		res.PodsReady, res.PodsScheduled = time.Since(start), o.schedulePods
	}

	// 1. Raw client-go cordon, on N nodes of their own (deleted after), so
	// that the operator starts from untouched nodes without waiting for
	// the node lifecycle controller to lift its unschedulable taint.
	raw, err := h.createNodes(ctx, nodeSet{name: "raw"}, o.nodes)
	if err != nil {
		return nil, err
	}
	logf("raw: cordoning %d nodes with %d unthrottled client-go workers", len(raw), o.workers)
	if res.Raw, err = h.rawCordon(ctx, raw, res); err != nil {
		return nil, err
	}
	logf("raw: %d nodes cordoned in %s; deleting them", len(raw), res.Raw.Round(time.Millisecond))
	if err := h.deleteNodes(ctx, raw); err != nil {
		return nil, err
	}

	// 2. Operator at steady state.
	logf("creating RemediationPolicy %s", policyName)
	if err := h.createPolicy(ctx, policyName, benchPolicy()); err != nil {
		return nil, err
	}
	startOp := func() (*operator, error) {
		op, err := h.startOperator(ctx, cancel)
		if err != nil {
			return nil, err
		}
		cleanup(op.stop)
		res.OperatorLog = op.LogPath
		logf("operator started (pid %d, log %s)", op.Pid(), op.LogPath)
		return op, nil
	}
	// What the apiserver sends the starting operator: its caches' initial
	// lists, and the NodeHealths it creates.
	beforeStart, err := h.apiserverSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	op, err := startOp()
	if err != nil {
		return nil, err
	}
	logf("waiting for %d NodeHealths Healthy", len(nodes))
	if err := op.waitReady(ctx, o.timeout); err != nil {
		return nil, err
	}
	if err := h.waitPhase(ctx, nodes, phaseHealthy); err != nil {
		return nil, err
	}
	res.Steady = time.Since(op.Started())
	afterStart, err := h.apiserverSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	res.Start = afterStart.minus(beforeStart)
	res.CacheSync, res.Controllers = op.cacheSynced()
	logf("steady: every NodeHealth Healthy %s after the operator started (caches of %d controllers synced after %s)", res.Steady.Round(time.Millisecond), res.Controllers, res.CacheSync.Round(time.Millisecond))
	if o.idle > 0 {
		logf("idle: measuring CPU for %s", o.idle)
		cpu := takeCPU()
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(o.idle):
		}
		res.CPUIdle, res.Idle = takeCPU().minus(cpu), o.idle
	}
	res.RSSIdle, _ = takeRSS()
	if o.heapProfile != "" {
		if err := writeHeapProfile(ctx, op, &o, o.heapProfile); err != nil {
			return nil, err
		}
	}
	live, inuse, err := op.liveHeap(ctx)
	if err != nil {
		return nil, err
	}
	res.Heap = heapSample{Live: live, Inuse: inuse, RSS: processRSS(op.Pid())}
	logf("steady: the operator's live heap %.1f MiB, RSS %.0f MiB (%.1f and %.1f MiB per 1,000 nodes)", live/mib, res.Heap.RSS/mib, res.perThousand(live)/mib, res.perThousand(res.Heap.RSS)/mib)

	// 3. The burst, and the writes it took.
	logf("burst: creating %d NodeHealthEvents at once", len(nodes))
	stopSampling := sampleMemory(ctx, op, op.Pid(), 250*time.Millisecond, o.operatorMemLimit, o.heapProfile != "")
	err = h.burst(ctx, op, nodes, res)
	res.MemBurst = stopSampling()
	if err != nil {
		return nil, err
	}
	logf("burst: %d nodes cordoned in %s (%.2fx raw); the operator's RSS peaked at %.0f MiB (%.0f MiB of heap allocated at the nearest read)",
		len(nodes), res.Operator.Round(time.Millisecond), res.ratio(), res.MemBurst.PeakRSS/mib, res.MemBurst.Peak.HeapAlloc/mib)
	bl := spreadOf(res.BurstLatency)
	logf("burst: each node from its finding to its cordon: p50 %s, p99 %s, max %s", dur(bl.P50), dur(bl.P99), dur(bl.Max))
	_, res.RSSPeak = takeRSS()
	if o.heapProfile != "" {
		ext := filepath.Ext(o.heapProfile)
		base := strings.TrimSuffix(o.heapProfile, ext)
		if err := writeHeapProfile(ctx, op, &o, base+"-burst"+ext); err != nil {
			return nil, err
		}
		if prof := res.MemBurst.PeakHeapProfile; prof != nil {
			if err := saveProfile(&o, base+"-peak"+ext, prof); err != nil {
				return nil, err
			}
		}
	}

	// 4. Single-event latency on fresh nodes.
	if o.latencySamples > 0 {
		fresh, err := h.createNodes(ctx, nodeSet{name: "latency", gpu: true}, o.latencySamples)
		if err != nil {
			return nil, err
		}
		if err := h.waitPhase(ctx, fresh, phaseHealthy); err != nil {
			return nil, err
		}
		logf("latency: %d single events, one at a time", len(fresh))
		if res.Latency, err = h.latency(ctx, fresh); err != nil {
			return nil, err
		}
		logf("latency samples in order, ms: %s", msList(res.Latency))
	}

	// 5. Detection to cordon through real monitors.
	if o.detectSamples > 0 {
		if res.Detect, err = h.detect(ctx, cleanup); err != nil {
			return nil, err
		}
		logf("detection samples in order, ms: %s", msList(res.Detect))
	}

	// 6. The fault wave: detection to drained, with pods and PDBs.
	if o.wave > 0 {
		if res.Wave, err = h.wave(ctx); err != nil {
			return nil, err
		}
		s := spreadOf(res.Wave.PerNode)
		logf("wave: %d nodes drained in %s; each from its finding: p50 %s, p99 %s, max %s", res.Wave.Nodes, dur(res.Wave.Whole), dur(s.P50), dur(s.P99), dur(s.Max))
	}

	// 7. The backlog: N events waiting when the operator starts.
	if o.runsBacklog() {
		fresh, err := h.createNodes(ctx, nodeSet{name: "backlog", gpu: true}, o.nodes)
		if err != nil {
			return nil, err
		}
		if err := h.waitPhase(ctx, fresh, phaseHealthy); err != nil {
			return nil, err
		}
		first := op
		stopFirst := func() {
			first.stop()
			res.addLogErrors(first)
		}
		if op, err = h.backlog(ctx, stopFirst, startOp, fresh, res); err != nil {
			return nil, err
		}
		if d, n := op.cacheSynced(); n >= res.Controllers {
			res.BacklogCacheSync = d
		}
		logf("backlog: %d nodes cordoned %s after the operator started (%.2fx raw)", len(fresh), res.Backlog.Round(time.Millisecond), ratio(res.Backlog, res.Raw))
	}
	res.RSSEnd, res.RSSBacklogPeak = takeRSS()

	op.stop()
	res.addLogErrors(op)
	logf("operator log: %s (%d error lines, %d more of reconciles cut short by its shutdown)", op.LogPath, res.OperatorErrors, res.OperatorShutdownErrors)
	if res.OperatorErrors > 0 {
		logf("  first: %s", firstBytes(res.OperatorErrorSample, 600))
	}
	return res, nil
}

// runsBacklog says whether this size measures the backlog: -backlog, and
// N within -backlog-max-nodes, since the backlog doubles the cluster's
// nodes.
func (o options) runsBacklog() bool {
	return o.backlog && (o.backlogMaxNodes == 0 || o.nodes <= o.backlogMaxNodes)
}

// skippedPhases names the phases of the cordon benchmark that this size
// does not run, and the flag why, for the tables.
func (o options) skippedPhases() []string {
	var out []string
	for _, ph := range []struct {
		skip bool
		name string
	}{
		{o.idle == 0, "idle CPU (-idle 0)"},
		{o.latencySamples == 0, "single events (-latency-samples 0)"},
		{o.detectSamples == 0, "detection (-detect-samples 0)"},
		{o.wave == 0, "fault wave (-wave 0)"},
		{!o.backlog, "backlog (-backlog=false)"},
		{o.backlog && !o.runsBacklog(), fmt.Sprintf("backlog (N > -backlog-max-nodes %d)", o.backlogMaxNodes)},
	} {
		if ph.skip {
			out = append(out, ph.name)
		}
	}
	return out
}

// writeOut writes the tables so far to path (none when empty), so a long
// run that fails at its last size keeps the sizes before it.
func writeOut(path, table string) error {
	if path == "" {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("writing -out: %w", err)
	}
	if err := os.WriteFile(path, []byte(table), 0o644); err != nil {
		return fmt.Errorf("writing -out: %w", err)
	}
	return nil
}

// msList prints durations as milliseconds, in order.
func msList(ds []time.Duration) string {
	ms := make([]string, len(ds))
	for i, d := range ds {
		ms[i] = fmt.Sprintf("%.0f", float64(d)/float64(time.Millisecond))
	}
	return strings.Join(ms, " ")
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
