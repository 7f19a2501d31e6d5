package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
)

// soakPolicy patches the chart's default policy (config/samples') for
// kwok, as the e2e suite does: durations in seconds so that cycles
// complete within the run, one-step suites judged by exit code (kwok runs
// no container), no certification of new nodes, and the circuit breaker
// off (the soak quarantines far more nodes per ten minutes than its 10%
// allows, and an open breaker would stop the rest of the run). The rules
// are the sample's with the NVLink rule's recovery.clearAfter at 30 s
// instead of 15 minutes, so that a node quarantined for NVLink errors
// returns within the settle time. Budgets are the sample's (10%, one per
// clique) until the policy edits change them.
const soakPolicy = `{"spec":{
  "certification":{"newNodes":false,"backoff":"2s","steps":` + kwokStep + `},
  "recertification":{"soakWindow":"3s","backoff":"2s","maxAttempts":2,"steps":` + kwokStep + `},
  "remediation":{"diagnostics":null,"rebootNode":{"timeout":"2m"},"resetGPU":{"timeout":"2m"}},
  "circuitBreaker":{"enabled":false},
  "computeDomain":{"singleReportTaintsClique":true},
  "drain":{"timeout":"5m"},
  "rules":[
    {"name":"repeated-app-xids","match":{"checks":["XID"],"codes":["13","31"]},"verdict":"Quarantine","action":"Recertify","debounce":{"count":5,"window":"24h"}},
    {"name":"ignore-preemptive-cleanup","match":{"checks":["XID"],"codes":["45"]},"verdict":"Ignore"},
    {"name":"nvlink-error-rate","match":{"checks":["NVLinkErrors"]},"verdict":"Quarantine","action":"Recertify","debounce":{"count":3,"window":"10m"},"recovery":{"clearAfter":"30s"}}
  ]
}}`

// kwokStep is a one-step suite judged by its exit code (kwok finishes Job
// pods with exit code 0 about a second after they start).
const kwokStep = `[{"name":"recertify","job":{"image":"registry.invalid/recertify:kwok"},"timeout":"2m","parser":{"type":"exit-code"}}]`

// run does the whole soak; its deferred cleanups stop every process and
// delete the cluster whatever happens.
func run(sigCtx context.Context, o options) (_ []breach, err error) {
	started := time.Now()
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "gpuhealth-soak-")
	if err != nil {
		return nil, err
	}
	logf("seed %d; run folder %s", o.seed, dir)
	ctx, cancel := context.WithCancel(sigCtx)
	defer cancel()

	var env *framework.Env
	var second *framework.Process
	failed := true
	defer func() {
		cancel()
		if second != nil {
			second.Stop()
		}
		if env != nil {
			tctx, tcancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer tcancel()
			keep := failed || o.keep
			if terr := env.Teardown(tctx, keep); terr != nil {
				logf("WARNING: tearing down: %v", terr)
				if env.Cluster != nil {
					logf("remove the cluster with: KWOK_WORKDIR=%s %s delete cluster --name %s", env.Cluster.WorkDir, filepath.Join(env.Cluster.BinDir, "kwokctl"), env.Cluster.Name)
				}
			}
			if keep {
				logf("logs of every component, the objects and each node's scenario are in %s", dir)
				return
			}
		}
		_ = os.RemoveAll(dir)
	}()

	env, err = framework.Setup(ctx, framework.Options{
		Prefix: "gpuhealth-soak", Root: root, Dir: dir, Nodes: o.nodes, MonitorNodes: o.monitors, KernelLog: true,
		// Outages of up to a minute: the cluster's own controllers must
		// outlive them (nobody restarts them).
		NoControllerLeaderElection: true,
		PolicyPatch:                soakPolicy, Log: logf,
	})
	if err != nil {
		return nil, fmt.Errorf("setting up: %w", err)
	}
	bdir := filepath.Join(dir, "operator-b")
	if err := os.MkdirAll(bdir, 0o700); err != nil {
		return nil, err
	}
	if second, err = framework.NewOperator(ctx, env.Cluster, env.Bins.Operator, bdir); err != nil {
		return nil, err
	}
	logf("starting the second operator replica (log %s)", second.LogPath)
	if err := second.Start(ctx); err != nil {
		return nil, err
	}

	rng := rand.New(rand.NewPCG(o.seed, o.seed^0x9e3779b97f4a7c15))
	c := &chaos{
		env: env, rng: rng, opts: o, led: newLedger(env.Cluster.Client),
		replicas: []*replica{{name: "a", p: env.Operator}, {name: "b", p: second}},
		cliques:  map[int][]string{}, cliqueOpen: map[int]bool{}, nvlinkOpen: map[string]bool{},
		n:    counters{faults: map[string]int{}, codes: map[int]int{}},
		done: map[string]bool{},
	}
	cliqueOf := map[string]string{}
	for i, n := range env.Nodes {
		cliqueOf[n] = fmt.Sprintf("%s.%d", framework.ClusterUUID, i/4)
		c.cliques[i/4] = append(c.cliques[i/4], n)
		if m, ok := env.Monitors[n]; ok {
			c.monitors = append(c.monitors, &monitor{m: m, index: i, readyAt: time.Now()})
		} else {
			c.synthetic = append(c.synthetic, n)
		}
	}
	if c.pre, err = markByHuman(ctx, env.Cluster.Client, rng, c.synthetic); err != nil {
		return nil, err
	}
	for n := range c.pre {
		c.preExtra = append(c.preExtra, n)
	}
	sort.Strings(c.preExtra)
	c.obs = newObserver(cliqueOf, c.pre)
	if err := c.obs.start(ctx, env.Cluster); err != nil {
		return nil, err
	}
	if err := readBudgets(ctx, env.Cluster.Client, c.obs); err != nil {
		return nil, err
	}
	if err := workloads(ctx, env, c.synthetic); err != nil {
		return nil, err
	}
	go c.supervise(ctx)

	logf("chaos for %s on %d nodes (%d with a monitor), two operator replicas; seed %d", o.duration, len(env.Nodes), len(c.monitors), o.seed)
	chaosStart := time.Now()
	if err := c.loop(ctx, o); err != nil {
		return nil, err
	}
	chaosEnd := time.Now()
	breaches, rep, err := c.settleAndCheck(ctx, o)
	if err != nil {
		return nil, err
	}
	rep.Seed, rep.Command, rep.Date = o.seed, commandLine(), started
	rep.Nodes, rep.Monitors, rep.Chaos = len(env.Nodes), len(c.monitors), chaosEnd.Sub(chaosStart)
	rep.Total = time.Since(started)
	rep.Breaches = breaches
	table := rep.markdown()
	fmt.Print(table)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(table), 0o600); err != nil {
			return breaches, fmt.Errorf("writing %s: %w", o.out, err)
		}
	}
	failed = len(breaches) > 0
	return breaches, nil
}

// markByHuman cordons and taints a few nodes as a human would, before the
// run, with a field manager that is not gpuhealth's: two cordoned, one
// tainted with gpuhealth's own quarantine taint, one with a taint of its
// own, one cordoned and tainted. gpuhealth must never lift any of it.
func markByHuman(ctx context.Context, c client.Client, rng *rand.Rand, nodes []string) (map[string]preexisting, error) {
	perm := rng.Perm(len(nodes))
	reserved := corev1.Taint{Key: "example.com/reserved", Value: "team-a", Effect: corev1.TaintEffectNoSchedule}
	quarantine := corev1.Taint{Key: "gpuhealth.dev/quarantined", Effect: corev1.TaintEffectNoSchedule}
	marks := []struct {
		cordon bool
		taints []corev1.Taint
	}{{true, nil}, {true, nil}, {false, []corev1.Taint{quarantine}}, {false, []corev1.Taint{reserved}}, {true, []corev1.Taint{reserved}}}
	out := map[string]preexisting{}
	for i, mk := range marks {
		name := nodes[perm[i]]
		p := preexisting{Cordon: mk.cordon}
		for _, t := range mk.taints {
			p.Taints = append(p.Taints, taintString(t))
		}
		// The operators and kwok write the node too: read it again on a conflict.
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var n corev1.Node
			if err := c.Get(ctx, types.NamespacedName{Name: name}, &n); err != nil {
				return err
			}
			n.Spec.Unschedulable = n.Spec.Unschedulable || mk.cordon
			n.Spec.Taints = append(n.Spec.Taints, mk.taints...)
			return c.Update(ctx, &n, client.FieldOwner(humanManager))
		}); err != nil {
			return nil, fmt.Errorf("marking %s as a human: %w", name, err)
		}
		out[name] = p
		logf("a human marked %s before the run: cordon %v, taints %v", name, p.Cordon, p.Taints)
	}
	return out, nil
}

// readBudgets records the policy's budgets at the start.
func readBudgets(ctx context.Context, c client.Client, obs *observer) error {
	var p gpuhealthv1alpha1.RemediationPolicy
	if err := c.Get(ctx, types.NamespacedName{Name: "default"}, &p); err != nil {
		return fmt.Errorf("reading the default policy: %w", err)
	}
	b := p.Spec.Budgets
	if b.MaxUnavailable == nil || b.MaxUnavailablePerClique == nil {
		return fmt.Errorf("the default policy sets no maxUnavailable or maxUnavailablePerClique; the soak checks the budgets it sets")
	}
	obs.setBudgets(budgetSetting{At: time.Now().Add(-time.Hour), MaxUnavailable: *b.MaxUnavailable, PerClique: *b.MaxUnavailablePerClique})
	logf("budgets: maxUnavailable %s, maxUnavailablePerClique %s of %d managed nodes", b.MaxUnavailable.String(), b.MaxUnavailablePerClique.String(), obs.managed)
	return nil
}

// workloads runs two training Deployments of whole-node pods behind PDBs
// on the nodes without a monitor, so that drains evict real pod objects.
func workloads(ctx context.Context, env *framework.Env, nodes []string) error {
	replicas := int32(max(2, len(nodes)/8))
	for _, name := range []string{"trainer-a", "trainer-b"} {
		if err := framework.CreateWorkload(ctx, env.Cluster, framework.Workload{
			Namespace: "ml", Name: name, Replicas: replicas, Allowed: nodes, MinAvailable: ptr.To(replicas - 2),
		}); err != nil {
			return err
		}
	}
	logf("two training Deployments of %d whole-node pods each, PDB minAvailable %d", replicas, replicas-2)
	return nil
}

// loop runs the chaos until o.duration has passed: a random action every
// -min-gap to -max-gap, and the leader kills, apiserver outages and monitor
// kills at their own random times.
func (c *chaos) loop(ctx context.Context, o options) error {
	start := time.Now()
	end := start.Add(o.duration)
	frac := func(lo, hi float64) time.Time {
		return start.Add(time.Duration((lo + c.rng.Float64()*(hi-lo)) * float64(o.duration)))
	}
	next := func(mean time.Duration) time.Time {
		return time.Now().Add(between(c.rng, mean/2, mean*3/2))
	}
	// The first outage comes early enough that the cluster's own
	// controllers, whose watches back off for up to 30 s while the
	// apiserver is away, have caught up before the chaos ends: the settle
	// then waits for gpuhealth, not for them.
	nextLeader, nextMonitor, nextOutage := frac(0.1, 0.3), frac(0.15, 0.35), frac(0.3, 0.45)
	c.coverAfter = start.Add(o.duration / 3)
	lastReport := time.Now()
	for time.Now().Before(end) {
		gap := between(c.rng, o.minGap, o.maxGap)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(gap):
		}
		c.runDue(ctx, false)
		now := time.Now()
		var err error
		switch {
		case now.After(nextOutage):
			err = c.outage(ctx)
			nextOutage = next(o.outageEvery)
		case now.After(nextLeader):
			c.killLeader(ctx)
			nextLeader = next(o.leaderEvery)
		case now.After(nextMonitor):
			err = c.killMonitorMidBurst(ctx)
			nextMonitor = next(o.monitorEvery)
		default:
			err = c.step(ctx)
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			logf("chaos action failed (going on): %v", err)
		}
		if time.Since(lastReport) >= 30*time.Second {
			lastReport = time.Now()
			c.progress(time.Since(start))
		}
	}
	return nil
}

// progress prints a line of totals and the phases now.
func (c *chaos) progress(elapsed time.Duration) {
	c.mu.Lock()
	faults := 0
	for _, n := range c.n.faults {
		faults += n
	}
	line := fmt.Sprintf("%s: %d faults, %d leader kills, %d outages, %d monitor kills, %d uncordons, %d policy edits",
		elapsed.Round(time.Second), faults, c.n.leaderKills, c.n.outages, c.n.monitorKills, c.n.uncordons, c.n.policyEdits)
	c.mu.Unlock()
	var ps []string
	for p, n := range c.obs.phases() {
		ps = append(ps, fmt.Sprintf("%s %d", p, n))
	}
	sort.Strings(ps)
	logf("%s; phases: %s", line, strings.Join(ps, ", "))
}

// settleAndCheck ends the chaos (open conditions resolve, every process
// runs, every written finding is written), waits for every node to be
// Healthy or Failed with a reason (until -settle after the last fault),
// waits for the counts and Events to arrive, and runs the checks.
func (c *chaos) settleAndCheck(ctx context.Context, o options) ([]breach, *report, error) {
	logf("chaos over; resolving the open conditions and waiting for every node to settle (up to %s after the last fault)", o.settle)
	if err := framework.Poll(ctx, 2*time.Minute, func() (bool, string) {
		c.runDue(ctx, true)
		c.mu.Lock()
		left := len(c.due)
		c.mu.Unlock()
		return left == 0, fmt.Sprintf("%d conditions not resolved yet", left)
	}); err != nil {
		return nil, nil, err
	}
	if err := framework.Poll(ctx, 2*time.Minute, func() (bool, string) {
		for _, r := range c.replicas {
			if !r.p.Running() {
				return false, "operator " + r.name + " is not running again yet"
			}
		}
		for _, m := range c.monitors {
			if !m.m.Running() {
				return false, "the monitor on " + m.m.Node + " is not running again yet"
			}
		}
		return true, ""
	}); err != nil {
		return nil, nil, err
	}
	if err := framework.Poll(ctx, 2*time.Minute, func() (bool, string) {
		left, err := c.led.flush(ctx)
		return left == 0, fmt.Sprintf("%d written findings not written yet: %v", left, err)
	}); err != nil {
		return nil, nil, err
	}
	c.mu.Lock()
	lastFault := c.lastFault
	c.mu.Unlock()
	if lastFault.IsZero() {
		lastFault = time.Now()
	}
	var unsettled []breach
	settleErr := framework.Poll(ctx, time.Until(lastFault.Add(o.settle)), func() (bool, string) {
		var list gpuhealthv1alpha1.NodeHealthList
		if err := c.env.Cluster.Client.List(ctx, &list); err != nil {
			return false, err.Error()
		}
		unsettled = checkSettled(list.Items)
		if len(list.Items) < len(c.env.Nodes) {
			unsettled = append(unsettled, breach{invSettled, "(fleet)", fmt.Sprintf("%d NodeHealths for %d nodes", len(list.Items), len(c.env.Nodes))})
		}
		return len(unsettled) == 0, fmt.Sprintf("%d nodes not settled", len(unsettled))
	})
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	settledIn := time.Since(lastFault)
	c.obs.countCheck(invSettled, len(c.env.Nodes))
	if settleErr == nil {
		logf("every node Healthy or Failed with a reason %s after the last fault", settledIn.Round(time.Second))
	}
	var breaches []breach
	breaches = append(breaches, unsettled...)

	want := c.led.want()
	var countBreaches []breach
	_ = framework.Poll(ctx, 2*time.Minute, func() (bool, string) {
		g, err := got(ctx, c.env.Cluster.Client)
		if err != nil {
			return false, err.Error()
		}
		countBreaches = checkCounts(want, g)
		return len(countBreaches) == 0, fmt.Sprintf("%d findings without their exact count", len(countBreaches))
	})
	c.obs.countCheck(invCounts, len(want))
	breaches = append(breaches, countBreaches...)

	// Events are sent asynchronously: wait until their number has not
	// moved for five seconds.
	last, stable := -1, time.Now()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && time.Since(stable) < 5*time.Second; {
		if n := c.obs.eventsCount(); n != last {
			last, stable = n, time.Now()
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := framework.Poll(ctx, time.Minute, func() (bool, string) {
		err := c.obs.catchUp(ctx, c.env.Cluster.Client)
		return err == nil, fmt.Sprint(err)
	}); err != nil {
		return nil, nil, err
	}
	fb, counts := c.obs.final()
	breaches = append(fb, breaches...)

	rep := &report{}
	c.mu.Lock()
	rep.Counters = c.n
	rep.Faults, rep.Codes = map[string]int{}, map[int]int{}
	for k, v := range c.n.faults {
		rep.Faults[k] = v
	}
	for k, v := range c.n.codes {
		rep.Codes[k] = v
	}
	c.mu.Unlock()
	rep.Transitions, rep.Jobs, rep.Events = c.obs.tally()
	rep.Checks = c.obs.checksDone()
	rep.Findings = len(want)
	for _, n := range want {
		rep.Occurrences += n
	}
	rep.SettledIn, rep.Settled = settledIn, settleErr == nil
	rep.MaxOut = c.obs.maxOutSeen()
	rep.Phases = c.obs.phases()
	for _, tc := range counts {
		rep.TransitionsWithoutEvent += max(tc.Transitions-tc.Events, 0)
	}
	return breaches, rep, nil
}
