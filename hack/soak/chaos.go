package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
	"github.com/gpuhealth/gpuhealth/monitors/fakenvml"
)

// humanManager is the field manager of everything "a human" does to the
// nodes in the soak: the pre-existing cordons and taints, the uncordons.
const humanManager = "soak-human"

// leaseName is the operator's leader election Lease (its default
// --leader-election-id) in framework.Namespace.
const leaseName = "gpuhealth-operator.gpuhealth.dev"

// replica is one operator process; the supervisor starts it again when it
// is not running and not held down.
type replica struct {
	name      string
	p         *framework.Process
	holdUntil time.Time
	// killed is set when the soak killed it, until it runs again.
	killed   bool
	starting bool
	// failing is set while starts fail (the apiserver is away), so that
	// the first failure of a streak is logged, not each retry.
	failing bool
}

// monitor is one node's monitor process and what the soak did to it.
type monitor struct {
	m     *framework.Monitor
	index int
	// holdUntil keeps the supervisor from restarting it (a kill).
	holdUntil time.Time
	killed    bool
	starting  bool
	failing   bool
	// readyAt: injections wait until the process has run a moment (NVML
	// delivers only what happens after it initialised).
	readyAt time.Time
	// lastScenario is the last XID or fabric line written to its scenario;
	// a kill waits until that has certainly been read and spooled.
	lastScenario time.Time
	fabricOpen   bool
}

// counters are the run's chaos totals.
type counters struct {
	faults           map[string]int
	codes            map[int]int
	leaderKills      int
	outages          int
	outageDown       time.Duration
	monitorKills     int
	burstXIDs        int
	uncordons        int
	policyEdits      int
	operatorRestarts int
	operatorExits    int
	monitorRestarts  int
	skipped          int
}

// pending is a delayed chaos step: a condition finding resolving.
type pending struct {
	at   time.Time
	what string
	do   func(context.Context) error
}

// chaos drives the faults and the failures.
type chaos struct {
	env  *framework.Env
	rng  *rand.Rand
	led  *ledger
	obs  *observer
	opts options

	replicas []*replica
	monitors []*monitor
	// synthetic are the nodes without a monitor: their findings are written
	// by the soak.
	synthetic []string
	// cliques lists the nodes of each clique, by the clique's number.
	cliques     map[int][]string
	cliqueOpen  map[int]bool
	nvlinkOpen  map[string]bool
	pre         map[string]preexisting
	preExtra    []string
	apiDown     bool
	lastFault   time.Time
	due         []pending
	budgetIndex int
	// done says which kinds of action happened; past coverAfter the ones
	// that did not come first.
	done       map[string]bool
	coverAfter time.Time

	mu sync.Mutex
	n  counters
}

// The kinds of fault, as the report lists them.
const (
	kindFatalWritten  = "fatal XID, written finding"
	kindFatalMonitor  = "fatal XID, monitor (fake NVML)"
	kindDegradedXID   = "degraded: XID 13/31 repeats, written finding"
	kindNVLink        = "degraded: NVLink error-rate crossing, written finding"
	kindKernelBurst   = "degraded: XID 13 burst, monitor (kernel log)"
	kindKilledBurst   = "degraded: XID 31 burst, monitor (kernel log) SIGKILLed mid-burst"
	kindFabricMonitor = "fabric fault on a clique, monitor (fake NVML)"
	kindFabricWritten = "fabric fault on a clique, written finding"
	kindUncordon      = "human uncordon"
	kindPolicyEdit    = "policy edit"
)

// fault counts one fault of a kind (and its XID code, when it has one).
func (c *chaos) fault(kind string, code int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n.faults[kind]++
	if code > 0 {
		c.n.codes[code]++
	}
	c.lastFault = time.Now()
	c.done[kind] = true
}

func (c *chaos) apiIsDown() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.apiDown
}

// supervise starts every replica and monitor that is not running (and not
// held down by a kill) again, checking every second, as a Deployment and a
// DaemonSet would; each start runs on its own (a start fails and is retried
// while the apiserver is away: the operator exits when it cannot reach it).
// A replica that exited by itself (the leader loses its Lease while the
// apiserver is away, and exits) is counted.
func (c *chaos) supervise(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		c.mu.Lock()
		for _, r := range c.replicas {
			if !r.starting && !r.p.Running() && now.After(r.holdUntil) {
				r.starting = true
				go c.startReplica(ctx, r)
			}
		}
		for _, m := range c.monitors {
			if !m.starting && !m.m.Running() && now.After(m.holdUntil) {
				m.starting = true
				go c.startMonitor(ctx, m)
			}
		}
		c.mu.Unlock()
	}
}

func (c *chaos) startReplica(ctx context.Context, r *replica) {
	err := r.p.Start(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	r.starting = false
	if err != nil {
		if ctx.Err() == nil && !r.failing {
			logf("starting operator %s again: %v (retrying every second)", r.name, err)
		}
		r.failing = true
		return
	}
	r.failing = false
	c.n.operatorRestarts++
	if !r.killed {
		c.n.operatorExits++
		logf("operator %s had exited by itself (see %s); started again", r.name, r.p.LogPath)
	}
	r.killed = false
}

func (c *chaos) startMonitor(ctx context.Context, m *monitor) {
	err := m.m.Start(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	m.starting = false
	if err != nil {
		if ctx.Err() == nil && !m.failing {
			logf("starting the monitor on %s again: %v (retrying every second)", m.m.Node, err)
		}
		m.failing = true
		return
	}
	m.failing = false
	c.n.monitorRestarts++
	if !m.killed {
		logf("the monitor on %s had exited by itself (see %s); started again", m.m.Node, m.m.LogPath)
	}
	m.killed = false
	m.readyAt = time.Now().Add(3 * time.Second)
}

// usable lists the monitors that may be given a fault now.
func (c *chaos) usable(forKill bool) []*monitor {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	var out []*monitor
	for _, m := range c.monitors {
		if m.killed || !m.m.Running() || now.Before(m.readyAt) {
			continue
		}
		if forKill && (m.fabricOpen || now.Sub(m.lastScenario) < 8*time.Second) {
			continue
		}
		out = append(out, m)
	}
	return out
}

func pick[T any](rng *rand.Rand, xs []T) T { return xs[rng.IntN(len(xs))] }

// between is a random duration in [lo, hi).
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// fatalXIDs are the fatal XIDs injected, weighted by repetition: the GPU
// fallen off the bus (reboot), ECC, GSP and memory faults (GPU reset),
// and an XID the catalog does not know (a person decides: the node ends
// Failed once drained).
var fatalXIDs = []int{
	79, 79, 79, 79, 79, 79, 79, 79, 48, 48, 48, 48, 48, 48,
	119, 119, 119, 119, 119, 95, 95, 95, 95, 62, 62, 140, 140, 120, 120, 200,
}

// step does one random chaos action. Synthetic findings and the actions
// that need the apiserver are skipped while it is down.
func (c *chaos) step(ctx context.Context) error {
	type action struct {
		weight int
		name   string
		do     func(context.Context) error
	}
	actions := []action{
		{30, kindFatalWritten, c.fatalSynthetic},
		{10, kindFatalMonitor, c.fatalMonitor},
		{14, kindDegradedXID, c.degradedSynthetic},
		{8, kindNVLink, c.nvlink},
		{3, kindKernelBurst, c.kernelBurst},
		{2, kindFabricMonitor, c.fabricOnMonitor},
		{2, kindFabricWritten, c.fabricWritten},
		{4, kindUncordon, c.uncordon},
		{2, kindPolicyEdit, c.policyEdit},
	}
	// Past a third of the run, every third action is one of a kind that
	// has not happened yet (one may find no target for a while), so that
	// even a short run has one of each.
	if c.coverAfter.Before(time.Now()) && c.rng.IntN(3) == 0 {
		var undone []action
		c.mu.Lock()
		for _, a := range actions {
			if !c.done[a.name] {
				undone = append(undone, a)
			}
		}
		c.mu.Unlock()
		if len(undone) > 0 {
			return pick(c.rng, undone).do(ctx)
		}
	}
	total := 0
	for _, a := range actions {
		total += a.weight
	}
	r := c.rng.IntN(total)
	for _, a := range actions {
		if r -= a.weight; r < 0 {
			return a.do(ctx)
		}
	}
	return nil
}

func (c *chaos) synthNode() (string, int) {
	n := pick(c.rng, c.synthetic)
	i, _ := nodeIndex(n)
	return n, i
}

func (c *chaos) fatalSynthetic(ctx context.Context) error {
	if c.apiIsDown() {
		c.skip()
		return nil
	}
	n, i := c.synthNode()
	if len(c.preExtra) > 0 {
		// Every pre-marked node gets a fault early on, so that gpuhealth
		// fences and returns each of them.
		n, c.preExtra = c.preExtra[0], c.preExtra[1:]
		i, _ = nodeIndex(n)
	}
	code := pick(c.rng, fatalXIDs)
	if err := c.led.occur(ctx, xidSpec(n, i, c.rng.IntN(4), code), 1); err != nil {
		return err
	}
	c.fault(kindFatalWritten, code)
	return nil
}

func (c *chaos) fatalMonitor(_ context.Context) error {
	ms := c.usable(false)
	if len(ms) == 0 {
		c.skip()
		return nil
	}
	m := pick(c.rng, ms)
	device, code := c.rng.IntN(4), pick(c.rng, fatalXIDs[:len(fatalXIDs)-1])
	if err := m.m.InjectXID(device, code); err != nil {
		return err
	}
	c.mu.Lock()
	m.lastScenario = time.Now()
	c.mu.Unlock()
	c.led.injected(findingKey{m.m.Node, gpuhealthv1alpha1.CheckXID, framework.GPUUUID(m.index, device), fmt.Sprint(code)}, 1)
	c.fault(kindFatalMonitor, code)
	return nil
}

func (c *chaos) degradedSynthetic(ctx context.Context) error {
	if c.apiIsDown() {
		c.skip()
		return nil
	}
	n, i := c.synthNode()
	code := pick(c.rng, []int{13, 31})
	k := int64(1 + c.rng.IntN(3))
	if err := c.led.occur(ctx, xidSpec(n, i, c.rng.IntN(4), code), k); err != nil {
		return err
	}
	c.fault(kindDegradedXID, code)
	return nil
}

func (c *chaos) nvlink(ctx context.Context) error {
	if c.apiIsDown() {
		c.skip()
		return nil
	}
	n, i := c.synthNode()
	spec := nvlinkSpec(n, i, c.rng.IntN(4), c.rng.IntN(2))
	if err := c.led.occur(ctx, spec, 1); err != nil {
		return err
	}
	c.fault(kindNVLink, 0)
	key := spec.EventName()
	c.mu.Lock()
	open := c.nvlinkOpen[key]
	c.nvlinkOpen[key] = true
	c.mu.Unlock()
	if !open {
		c.later(between(c.rng, 10*time.Second, 40*time.Second), "NVLink rate back under its threshold on "+n, func(ctx context.Context) error {
			c.mu.Lock()
			delete(c.nvlinkOpen, key)
			c.mu.Unlock()
			return c.led.resolve(ctx, spec)
		})
	}
	return nil
}

func (c *chaos) kernelBurst(_ context.Context) error {
	ms := c.usable(false)
	if len(ms) == 0 {
		c.skip()
		return nil
	}
	m := pick(c.rng, ms)
	n := 5 + c.rng.IntN(60)
	w, err := m.m.InjectKernelXIDs(6, 13, n, 10, 2*time.Millisecond)
	c.led.injected(findingKey{m.m.Node, gpuhealthv1alpha1.CheckXID, framework.GPUUUID(m.index, 6), "13"}, int64(w))
	if err != nil {
		return err
	}
	c.fault(kindKernelBurst, 13)
	return nil
}

// fabric opens a fabric fault on a clique with none open, among the
// cliques of monitored nodes (through the monitor's fake NVML) or the
// others (written); it resolves 10–60 s later.
func (c *chaos) fabricOnMonitor(ctx context.Context) error { return c.fabric(ctx, true) }

func (c *chaos) fabricWritten(ctx context.Context) error { return c.fabric(ctx, false) }

func (c *chaos) fabric(ctx context.Context, monitored bool) error {
	c.mu.Lock()
	var free []int
	for q, nodes := range c.cliques {
		_, hasMonitor := c.monitorOf(nodes[0])
		if !c.cliqueOpen[q] && hasMonitor == monitored {
			free = append(free, q)
		}
	}
	c.mu.Unlock()
	slices.Sort(free)
	if len(free) == 0 {
		c.skip()
		return nil
	}
	q := pick(c.rng, free)
	node := pick(c.rng, c.cliques[q])
	i, _ := nodeIndex(node)
	m, _ := c.monitorOf(node)
	hold := between(c.rng, 10*time.Second, 60*time.Second)
	if m != nil {
		if !slices.Contains(c.usable(false), m) {
			c.skip()
			return nil
		}
		if err := m.m.Inject(fabricLine(q, "unhealthy")); err != nil {
			return err
		}
		c.mu.Lock()
		m.fabricOpen, m.lastScenario, c.cliqueOpen[q] = true, time.Now(), true
		c.mu.Unlock()
		// The tracker reports an open condition once (again only after
		// five minutes, longer than any episode here).
		c.led.injected(findingKey{node, gpuhealthv1alpha1.CheckFabric, framework.GPUUUID(i, 0), "UNHEALTHY"}, 1)
		c.fault(kindFabricMonitor, 0)
		injectedAt := time.Now()
		c.later(hold, "fabric healthy again on "+node, func(context.Context) error {
			// A state, unlike an XID, is a finding only once the monitor
			// has polled it: the end of the chaos runs every pending step
			// at once, and a fault injected just before would otherwise
			// be healed before any poll saw it (and expected all the same).
			if d := time.Until(injectedAt.Add(minFabricEpisode)); d > 0 {
				time.Sleep(d)
			}
			if err := m.m.Inject(fabricLine(q, "healthy")); err != nil {
				return err
			}
			c.mu.Lock()
			m.fabricOpen, m.lastScenario, c.cliqueOpen[q] = false, time.Now(), false
			c.mu.Unlock()
			return nil
		})
		return nil
	}
	if c.apiIsDown() {
		c.skip()
		return nil
	}
	spec := fabricSpec(node, i, 0)
	if err := c.led.occur(ctx, spec, 1); err != nil {
		return err
	}
	c.mu.Lock()
	c.cliqueOpen[q] = true
	c.mu.Unlock()
	c.fault(kindFabricWritten, 0)
	c.later(hold, "fabric healthy again on "+node, func(ctx context.Context) error {
		if err := c.led.resolve(ctx, spec); err != nil {
			return err
		}
		c.mu.Lock()
		c.cliqueOpen[q] = false
		c.mu.Unlock()
		return nil
	})
	return nil
}

// minFabricEpisode is the shortest a fabric fault on a monitor's node
// lasts: the shortest hold the chaos draws, many of the monitor's fabric
// polls (1 s apart in the harness).
const minFabricEpisode = 10 * time.Second

// monitorOf is the monitor of node, if it has one.
func (c *chaos) monitorOf(node string) (*monitor, bool) {
	for _, m := range c.monitors {
		if m.m.Node == node {
			return m, true
		}
	}
	return nil, false
}

func fabricLine(clique int, health string) string {
	return fmt.Sprintf("fabric device=0 state=completed health=%s status=success clique=%d cluster=%s at=%s",
		health, clique, strings.ReplaceAll(framework.ClusterUUID, "-", ""), fakenvml.At(time.Now()))
}

// uncordon is a human uncordoning a node gpuhealth took out of service.
func (c *chaos) uncordon(ctx context.Context) error {
	if c.apiIsDown() {
		c.skip()
		return nil
	}
	cands := c.obs.outOfService()
	if len(cands) == 0 {
		c.skip()
		return nil
	}
	n := pick(c.rng, cands)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}
	if err := c.env.Cluster.Client.Patch(ctx, node, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"unschedulable":false}}`)),
		client.FieldOwner(humanManager)); err != nil {
		return fmt.Errorf("uncordoning %s as a human: %w", n, err)
	}
	c.mu.Lock()
	c.n.uncordons++
	c.done[kindUncordon] = true
	c.mu.Unlock()
	logf("a human uncordoned %s", n)
	return nil
}

// budgetChoices are the budgets policy edits cycle through.
var budgetChoices = []struct{ global, clique intstr.IntOrString }{
	{intstr.FromString("10%"), intstr.FromInt32(1)},
	{intstr.FromString("5%"), intstr.FromInt32(1)},
	{intstr.FromInt32(12), intstr.FromInt32(2)},
	{intstr.FromString("15%"), intstr.FromInt32(1)},
	{intstr.FromInt32(4), intstr.FromString("50%")},
}

func (c *chaos) policyEdit(ctx context.Context) error {
	if c.apiIsDown() {
		c.skip()
		return nil
	}
	c.budgetIndex = (c.budgetIndex + 1 + c.rng.IntN(len(budgetChoices)-1)) % len(budgetChoices)
	b := budgetChoices[c.budgetIndex]
	soak := pick(c.rng, []string{"3s", "5s", "8s"})
	patch := fmt.Sprintf(`{"spec":{"budgets":{"maxUnavailable":%s,"maxUnavailablePerClique":%s},"recertification":{"soakWindow":%q}}}`,
		jsonIntOrString(b.global), jsonIntOrString(b.clique), soak)
	p := &gpuhealthv1alpha1.RemediationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if err := c.env.Cluster.Client.Patch(ctx, p, client.RawPatch("application/merge-patch+json", []byte(patch)), client.FieldOwner(humanManager)); err != nil {
		return fmt.Errorf("editing the policy: %w", err)
	}
	c.obs.setBudgets(budgetSetting{At: time.Now(), MaxUnavailable: b.global, PerClique: b.clique})
	c.mu.Lock()
	c.n.policyEdits++
	c.done[kindPolicyEdit] = true
	c.mu.Unlock()
	logf("policy edit: maxUnavailable %s, maxUnavailablePerClique %s, soakWindow %s", b.global.String(), b.clique.String(), soak)
	return nil
}

func jsonIntOrString(v intstr.IntOrString) string {
	if v.Type == intstr.Int {
		return fmt.Sprint(v.IntVal)
	}
	return fmt.Sprintf("%q", v.StrVal)
}

func (c *chaos) skip() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n.skipped++
}

// later schedules a step (a condition resolving) at least d from now.
func (c *chaos) later(d time.Duration, what string, do func(context.Context) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.due = append(c.due, pending{at: time.Now().Add(d), what: what, do: do})
}

// runDue runs the delayed steps whose time has come (all of them when
// all), keeping those that failed for the next call.
func (c *chaos) runDue(ctx context.Context, all bool) {
	if c.apiIsDown() {
		return
	}
	c.mu.Lock()
	now := time.Now()
	var run, keep []pending
	for _, p := range c.due {
		if all || !p.at.After(now) {
			run = append(run, p)
		} else {
			keep = append(keep, p)
		}
	}
	c.due = keep
	c.mu.Unlock()
	for _, p := range run {
		if err := p.do(ctx); err != nil {
			logf("%s: %v (retrying)", p.what, err)
			c.mu.Lock()
			p.at = time.Now().Add(2 * time.Second)
			c.due = append(c.due, p)
			c.mu.Unlock()
		}
	}
}

// leader finds the replica holding the Lease: the Lease names its holder by
// host name and a random id, so the replica is the one whose
// leader_election_master_status gauge is 1.
func (c *chaos) leader(ctx context.Context) (*replica, string, error) {
	lease, err := c.env.Cluster.Clientset.CoordinationV1().Leases(framework.Namespace).Get(ctx, leaseName, metav1.GetOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("reading the leader Lease: %w", err)
	}
	holder := ""
	if lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}
	if holder == "" {
		return nil, "", fmt.Errorf("the leader Lease has no holder")
	}
	var leaders []*replica
	for _, r := range c.replicas {
		if r.p.Running() && isLeader(ctx, r.p.Metrics) {
			leaders = append(leaders, r)
		}
	}
	if len(leaders) != 1 {
		return nil, holder, fmt.Errorf("the Lease names %s, and %d running replicas say they lead", holder, len(leaders))
	}
	return leaders[0], holder, nil
}

// isLeader reads the leader election gauge from a replica's metrics.
func isLeader(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "leader_election_master_status{") && strings.Contains(l, `name="`+leaseName+`"`) {
			return strings.HasSuffix(strings.TrimSpace(l), " 1")
		}
	}
	return false
}

// killLeader SIGKILLs the replica holding the Lease; the supervisor starts
// it again 2–8 s later, so that two replicas run again. With no leader to
// be found (one is being elected) it does nothing.
func (c *chaos) killLeader(ctx context.Context) {
	r, holder, err := c.leader(ctx)
	if err != nil {
		logf("no leader to kill now: %v", err)
		c.skip()
		return
	}
	c.mu.Lock()
	r.holdUntil, r.killed = time.Now().Add(between(c.rng, 2*time.Second, 8*time.Second)), true
	c.mu.Unlock()
	r.p.Kill()
	c.mu.Lock()
	c.n.leaderKills++
	c.mu.Unlock()
	logf("SIGKILLed the leader, operator %s (Lease holder %s)", r.name, holder)
}

// minOutage is the shortest apiserver outage: longer than the operator's
// leader election renew deadline (10 s), so that the leader can lose its
// Lease.
const minOutage = 10 * time.Second

// outage stops the kube-apiserver for minOutage to -outage-max; meanwhile
// the monitors get faults, which wait in their spools.
func (c *chaos) outage(ctx context.Context) error {
	down := between(c.rng, minOutage, c.opts.outageMax)
	restart, err := c.env.Cluster.StopAPIServer(ctx)
	if err != nil {
		return fmt.Errorf("stopping the apiserver: %w", err)
	}
	start := time.Now()
	c.mu.Lock()
	c.apiDown = true
	c.n.outages++
	c.mu.Unlock()
	logf("kube-apiserver stopped for %s", down.Round(time.Second))
	deadline := start.Add(down)
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
		case <-time.After(between(c.rng, 3*time.Second, 10*time.Second)):
		}
		if ctx.Err() != nil || !time.Now().Before(deadline) {
			break
		}
		if c.rng.IntN(2) == 0 {
			_ = c.fatalMonitor(ctx)
		} else {
			_ = c.kernelBurst(ctx)
		}
	}
	err = restart()
	c.mu.Lock()
	c.apiDown = false
	c.n.outageDown += time.Since(start)
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("starting the apiserver again: %w", err)
	}
	logf("kube-apiserver back after %s", time.Since(start).Round(time.Second))
	return nil
}

// killMonitorMidBurst SIGKILLs a monitor in the middle of a burst of XIDs
// in its kernel log; the supervisor starts it again 1–3 s later, and every
// line must count once.
func (c *chaos) killMonitorMidBurst(_ context.Context) error {
	ms := c.usable(true)
	if len(ms) == 0 {
		logf("no monitor can be killed now (each has a fault in flight)")
		c.skip()
		return nil
	}
	m := pick(c.rng, ms)
	n := 200 + c.rng.IntN(1800)
	c.mu.Lock()
	m.holdUntil, m.killed = time.Now().Add(between(c.rng, time.Second, 3*time.Second)), true
	c.mu.Unlock()
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		w, err := m.m.InjectKernelXIDs(7, 31, n, 50, 5*time.Millisecond)
		done <- result{w, err}
	}()
	time.Sleep(between(c.rng, 20*time.Millisecond, 200*time.Millisecond))
	m.m.Kill()
	r := <-done
	c.led.injected(findingKey{m.m.Node, gpuhealthv1alpha1.CheckXID, framework.GPUUUID(m.index, 7), "31"}, int64(r.n))
	c.mu.Lock()
	c.n.monitorKills++
	c.n.burstXIDs += r.n
	c.n.faults[kindKilledBurst]++
	c.n.codes[31]++
	c.lastFault = time.Now()
	c.mu.Unlock()
	logf("SIGKILLed the monitor on %s mid-burst (%d XID 31 lines)", m.m.Node, r.n)
	return r.err
}
