// Command soak is gpuhealth's chaos soak: the real operator (two replicas,
// leader-elected) and monitors on a throwaway kwok cluster of fake GPU
// nodes, with faults and failures at random for a while, and an invariant
// checker watching throughout. It is a benchmark-style program, not a go
// test:
//
//	go run ./hack/soak                                # 30 minutes, 200 nodes
//	go run ./hack/soak -duration 90s -outage-max 30s  # the smoke make soak-smoke runs
//	go run ./hack/soak -seed 42                       # replay a run's choices
//
// What it does: e2e/framework creates the cluster, installs the chart,
// patches the default policy's durations down to seconds (as the e2e suite
// does), creates -nodes kwok nodes in cliques of four, runs a real
// gpuhealth-monitor (fake NVML, and a kernel log file) on the first
// -monitors of them, and the operator as two host processes with
// --leader-elect=true. A human cordons and taints a few nodes before the
// run; two training Deployments behind PDBs keep the drains honest. Then,
// at random (from -seed, printed):
//
//   - fatal XIDs (reboot, reset, and one the catalog does not know, which
//     ends Failed) and degraded faults (XID 13/31 repeats, NVLink error
//     rates) — through a monitor's fake NVML and kernel log on the
//     monitored nodes, written as findings the way a monitor writes them on
//     the others;
//   - fabric faults on cliques (the clique taint), resolving 10–60 s later;
//   - a human uncordoning a node gpuhealth took out of service;
//   - policy edits (budgets, soak window);
//   - the leader replica SIGKILLed (found through the Lease), restarted;
//   - the kube-apiserver stopped for 10 s to -outage-max (60 s) (monitors
//     spool meanwhile);
//   - a monitor SIGKILLed in the middle of a burst of kernel-log XIDs.
//
// The invariants (a breach fails the run, exit status 1, naming the node,
// the invariant and the evidence): never more nodes Draining, Recertifying
// or in Maintenance than the budgets allow, over the fleet or in a clique
// (every stretch out of service, from the histories the watch saw, against
// the budgets in force; and live, from the watch); a cordon or taint a human
// set before the run never lifted; every injected finding present with its
// exact count once the run settled; one Job per node, step and attempt of a
// cycle; no more Events than transitions (per node, reason and phase); each
// node's history one unbroken chain; every node Healthy, or Failed with a
// reason, within -settle of the last fault.
//
// It prints a Markdown table of the counts on stdout (and to -out) and
// progress on stderr. Everything it starts is stopped by it, also on error
// and Ctrl-C: the processes by their PIDs, the cluster by its exact name.
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

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// options are the command-line flags.
type options struct {
	duration     time.Duration
	nodes        int
	monitors     int
	seed         uint64
	settle       time.Duration
	out          string
	keep         bool
	minGap       time.Duration
	maxGap       time.Duration
	leaderEvery  time.Duration
	outageEvery  time.Duration
	outageMax    time.Duration
	monitorEvery time.Duration
}

func main() {
	var o options
	flag.DurationVar(&o.duration, "duration", 30*time.Minute, "How long the chaos lasts (the settle and the checks come after).")
	flag.IntVar(&o.nodes, "nodes", 200, "Fake GPU nodes (kwok), in cliques of four.")
	flag.IntVar(&o.monitors, "monitors", 8, "How many of them, the first ones, run a real gpuhealth-monitor; the others get findings written for them.")
	flag.Uint64Var(&o.seed, "seed", 0, "Seed of the random choices (0: from the time; the seed is printed, to replay a run).")
	flag.DurationVar(&o.settle, "settle", 5*time.Minute, "How long after the last fault every node must be Healthy or Failed with a reason.")
	flag.StringVar(&o.out, "out", "", "Also write the Markdown table to this file.")
	flag.BoolVar(&o.keep, "keep", false, "Keep the run's folder (logs, scenarios, objects) even when it passes.")
	flag.DurationVar(&o.minGap, "min-gap", 500*time.Millisecond, "Shortest pause between two random actions.")
	flag.DurationVar(&o.maxGap, "max-gap", 2500*time.Millisecond, "Longest pause between two random actions.")
	flag.DurationVar(&o.leaderEvery, "leader-kill-every", 4*time.Minute, "Mean time between two leader kills (the first comes within the first third of the run).")
	flag.DurationVar(&o.outageEvery, "outage-every", 6*time.Minute, "Mean time between two apiserver outages (the first 30-45% into the run).")
	flag.DurationVar(&o.outageMax, "outage-max", time.Minute, "Longest apiserver outage (each lasts from 10 s, longer than the operator's 10 s renew deadline, to this).")
	flag.DurationVar(&o.monitorEvery, "monitor-kill-every", 3*time.Minute, "Mean time between two monitor kills mid-burst (the first within the first third).")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: go run ./hack/soak [flags]\n\nChaos soak of gpuhealth on a local kwok cluster, with invariant checks.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "soak: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if o.duration <= 0 || o.nodes < 8 || o.monitors < 1 || o.monitors >= o.nodes || o.settle <= 0 ||
		o.minGap <= 0 || o.maxGap <= o.minGap || o.leaderEvery <= 0 || o.outageEvery <= 0 || o.monitorEvery <= 0 || o.outageMax <= minOutage {
		fmt.Fprintln(os.Stderr, "soak: -duration, -settle and the intervals must be positive, -max-gap above -min-gap, -outage-max above 10s, -nodes at least 8 and -monitors between 1 and -nodes-1")
		os.Exit(2)
	}
	// The soak's own watches retry through the outages it causes; their
	// client-go logs would only repeat that.
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	if o.seed == 0 {
		o.seed = uint64(time.Now().UnixNano())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	breaches, err := run(ctx, o)
	stop()
	switch {
	case err != nil:
		fmt.Fprintf(os.Stderr, "soak: %v\n(replay with -seed %d)\n", err, o.seed)
		os.Exit(1)
	case len(breaches) > 0:
		fmt.Fprintf(os.Stderr, "soak: %d invariant breaches (replay with -seed %d):\n", len(breaches), o.seed)
		for _, b := range breaches {
			fmt.Fprintf(os.Stderr, "  %s\n", b)
		}
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "soak: no invariant breached")
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[soak %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// repoRoot is the directory above the working directory holding go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run the soak inside the gpuhealth repository (no go.mod found above the working directory)")
		}
		dir = parent
	}
}

// commandLine is how this run was started, for the report.
func commandLine() string {
	return "go run ./hack/soak " + strings.Join(os.Args[1:], " ")
}
