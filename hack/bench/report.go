package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

// results is everything one run measured.
type results struct {
	Command         string
	Date            time.Time
	N, K            int
	HarnessWorkers  int
	OperatorWorkers int
	NProc           int
	CPU             string
	Kubernetes      string
	Kwok            string

	// Raw is the client-go loop's time to cordon all N nodes.
	Raw time.Duration
	// Operator is the first event create to the last node seen cordoned.
	Operator time.Duration
	// CreatesDone is when the harness's N creates had all returned.
	CreatesDone time.Duration
	// Quarantined is when every NodeHealth was Quarantined.
	Quarantined time.Duration
	// BurstLatency are the burst's nodes' times from their finding's
	// create (when it returned) to the node first seen cordoned, by node.
	BurstLatency []time.Duration

	// BacklogCreates is the harness's time to create N events with no
	// operator running; Backlog is a new operator process's start to the
	// last of those N nodes seen cordoned, BacklogQuarantined to the last
	// NodeHealth Quarantined.
	BacklogCreates, Backlog, BacklogQuarantined time.Duration
	// BacklogWrites are the apiserver's write counters from just before
	// the new operator starts until every backlog node is seen cordoned:
	// the fences and whatever else competed with them.
	BacklogWrites reqCounts

	// Writes are the apiserver's write counters over the burst, less the
	// harness's own HarnessCreates event creates.
	Writes         reqCounts
	HarnessCreates int64
	// BodyBytes are the bytes of the write requests' bodies over the same
	// interval (the apiserver's BodyMetric histogram, "" when it has
	// none), less the HarnessBytes of the harness's own creates.
	BodyBytes    reqCounts
	BodyMetric   string
	HarnessBytes float64
	// Reads are the apiserver's GET and LIST counters over the burst (the
	// harness makes none then): reads not served from an informer cache.
	Reads reqCounts
	// OperatorWrites are the operator's own client writes over the burst.
	OperatorWrites reqCounts
	// Transitions are the burst's Healthy → Quarantined transitions in the
	// NodeHealth histories, TransitionEvents the Fault Events the apiserver
	// holds for them: one each when every transition is published once.
	Transitions, TransitionEvents int

	// CPURaw, CPUCreates, CPUBurst and CPUBacklog are the CPU seconds every
	// process on the machine used in the raw loop, the harness's creates
	// alone, the burst and the backlog (until every node was seen
	// cordoned); nil where /proc cannot be read.
	CPURaw, CPUCreates, CPUBurst, CPUBacklog cpuSnapshot

	// Latency are the single-event samples; Detect are the samples from
	// an XID in a real monitor's NVML to the node seen cordoned.
	Latency, Detect []time.Duration

	// PodsPerNode workload pods ran on each of the N nodes; PodsReady is
	// how long their Deployment took to be ready.
	PodsPerNode int
	PodsReady   time.Duration
	// PodsScheduled says the pods came from a Deployment through
	// kube-scheduler, not bound by the harness.
	PodsScheduled bool
	// Steady is the operator's start to every NodeHealth Healthy;
	// CacheSync its start to the last of its Controllers starting workers
	// (caches synced), BacklogCacheSync the same for the restarted one.
	Steady, CacheSync, BacklogCacheSync time.Duration
	Controllers                         int
	// CPUIdle is each process's CPU over the idle window Idle.
	CPUIdle cpuSnapshot
	Idle    time.Duration
	// DetectMonitors is how many monitors ran at once for Detect.
	DetectMonitors int
	// RSSIdle is each process group's resident memory at steady state,
	// RSSPeak the peak of each (the largest process's VmHWM) after the
	// burst, latency and detection phases, RSSEnd and RSSBacklogPeak the
	// same at the end (after the backlog, with the restarted operator).
	RSSIdle, RSSPeak, RSSEnd, RSSBacklogPeak map[string]float64
	// MemBurst is the operator's memory sampled through the burst, from
	// the first create until every NodeHealth is Quarantined.
	MemBurst memProfile
	// Heap is the operator's memory at steady state, after the idle
	// window, right after a forced collection.
	Heap heapSample
	// Start is what the apiserver served from just before the operator's
	// start until every NodeHealth was Healthy: the caches' initial lists
	// among it.
	Start apiserverSnapshot

	// Wave is the fault wave (nil when skipped).
	Wave *waveResult
	// Skipped names the phases this size did not run, and why.
	Skipped []string

	// OperatorLog is the operator's log file; OperatorErrors counts its
	// error lines (the first is OperatorErrorSample), less the
	// OperatorShutdownErrors of reconciles its shutdown cut short.
	OperatorLog            string
	OperatorErrors         int
	OperatorErrorSample    string
	OperatorShutdownErrors int
}

// fillEnvironment records the machine and cluster the run used.
func (r *results) fillEnvironment(ctx context.Context, h *harness) {
	r.NProc = runtime.NumCPU()
	if out, err := exec.CommandContext(ctx, "nproc").Output(); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil {
			r.NProc = n
		}
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				r.CPU = strings.Join(strings.Fields(v), " ")
				break
			}
		}
		_ = f.Close()
	}
	if v, err := h.cs.Discovery().ServerVersion(); err == nil {
		r.Kubernetes = v.GitVersion
	}
	if out, err := exec.CommandContext(ctx, filepath.Join(h.c.BinDir, "kwok"), "--version").Output(); err == nil {
		r.Kwok = strings.TrimSpace(string(out))
	}
}

func (r *results) ratio() float64 { return ratio(r.Operator, r.Raw) }

func ratio(d, raw time.Duration) float64 {
	if raw <= 0 {
		return math.NaN()
	}
	return float64(d) / float64(raw)
}

func rate(n int, d time.Duration) string {
	if d <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f", float64(n)/d.Seconds())
}

// dur formats a duration for the table.
func dur(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
}

// percentile is the nearest-rank percentile of sorted samples.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// spread is the distribution of per-node samples the tables print.
type spread struct{ P50, P90, P99, Max time.Duration }

// spreadOf returns the nearest-rank percentiles and the largest of
// samples (zeros for none).
func spreadOf(samples []time.Duration) spread {
	s := sortedDurations(samples)
	if len(s) == 0 {
		return spread{}
	}
	return spread{P50: percentile(s, 0.50), P90: percentile(s, 0.90), P99: percentile(s, 0.99), Max: s[len(s)-1]}
}

// elapsed returns to[i] − from[i] for each i where both are set: a node's
// time from its own start (its finding's create) to what was awaited.
func elapsed(from, to []time.Time) []time.Duration {
	out := make([]time.Duration, 0, len(from))
	for i := range min(len(from), len(to)) {
		if !from[i].IsZero() && !to[i].IsZero() {
			out = append(out, to[i].Sub(from[i]))
		}
	}
	return out
}

// bytesOf formats a byte count for the tables.
func bytesOf(b float64) string {
	switch a := math.Abs(b); {
	case a >= 10*mib:
		return fmt.Sprintf("%.1f MiB", b/mib)
	case a >= 10*1024:
		return fmt.Sprintf("%.1f KiB", b/1024)
	default:
		return fmt.Sprintf("%.0f B", b)
	}
}

// isHeartbeat says whether a resource's writes are kwok's node heartbeats,
// which go on whatever the operator does and are left out of the total.
func isHeartbeat(k resKey) bool {
	return k.group == "coordination.k8s.io" && k.resource == "leases"
}

func verbs(c *reqCount) string {
	var parts []string
	for _, v := range sorted(c.verbs) {
		parts = append(parts, fmt.Sprintf("%s %.0f", v, c.verbs[v]))
	}
	s := strings.Join(parts, ", ")
	if c.failed > 0 {
		s += fmt.Sprintf(" (%.0f failed)", c.failed)
	}
	return s
}

// markdown renders the results as the tables of docs/performance.md.
func (r *results) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	n := float64(r.N)

	p("### Cordon speed: gpuhealth-operator vs. raw client-go, N=%d", r.N)
	p("")
	p("| Run | |")
	p("|---|---|")
	p("| Date | %s |", r.Date.UTC().Format("2006-01-02 15:04 MST"))
	p("| Command | `%s` |", r.Command)
	p("| Nodes (N) | %d kwok nodes labeled `%s=true`, %d workload pods each |", r.N, gpuLabel, r.PodsPerNode)
	cpu := fmt.Sprintf("%d (`nproc`)", r.NProc)
	if r.CPU != "" {
		cpu += ", " + r.CPU
	}
	p("| CPUs | %s |", cpu)
	p("| Software | Kubernetes %s (real kube-apiserver, etcd, controller-manager, scheduler; fake kwok nodes), %s, %s %s/%s, all on this machine |",
		orNA(r.Kubernetes), orNA(firstLine(r.Kwok)), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	p("| Operator log | %d error lines during the measurements |", r.OperatorErrors)
	p("| Phases skipped | %s |", r.skipped())
	p("")
	r.scaleMarkdown(p)
	p("| Cordon all N nodes | Time | Nodes/s |")
	p("|---|---:|---:|")
	p("| Raw: client-go merge-patch `spec.unschedulable=true`, %d workers, no client-side rate limit | %s | %s |", r.HarnessWorkers, dur(r.Raw), rate(r.N, r.Raw))
	p("| gpuhealth-operator (`--workers %d`): N NodeHealthEvents (XID 79, Fatal) created at once → every node seen cordoned | %s | %s |", r.OperatorWorkers, dur(r.Operator), rate(r.N, r.Operator))
	p("| **Ratio operator / raw** | **%.2f×** | |", r.ratio())
	p("| (harness's N event creates returned after) | %s | |", dur(r.CreatesDone))
	p("| (every NodeHealth Quarantined after) | %s | |", dur(r.Quarantined))
	if r.Transitions > 0 {
		p("| Fault Events per Healthy → Quarantined transition (burst) | %.2f (%d / %d) | |", float64(r.TransitionEvents)/float64(r.Transitions), r.TransitionEvents, r.Transitions)
	}
	p("")
	if len(r.BurstLatency) > 0 {
		s := spreadOf(r.BurstLatency)
		p("| Burst, each of its %d nodes: its finding created (the create returned) → the node first seen cordoned in a watch | p50 | p90 | p99 | max |", len(r.BurstLatency))
		p("|---|---:|---:|---:|---:|")
		p("| Finding → cordon, over the burst | %s | %s | %s | %s |", dur(s.P50), dur(s.P90), dur(s.P99), dur(s.Max))
		p("")
	}
	if r.Backlog > 0 {
		p("| Backlog: N events exist, then the operator starts (N fresh nodes) | Time | Nodes/s |")
		p("|---|---:|---:|")
		p("| Harness: N event creates alone, no operator running (the floor of the burst above) | %s | %s |", dur(r.BacklogCreates), rate(r.N, r.BacklogCreates))
		p("| gpuhealth-operator: process start (cache sync included) → every node seen cordoned | %s | %s |", dur(r.Backlog), rate(r.N, r.Backlog))
		p("| **Ratio operator / raw** | **%.2f×** | |", ratio(r.Backlog, r.Raw))
		p("| (every NodeHealth Quarantined after) | %s | |", dur(r.BacklogQuarantined))
		p("")
		writesTable(p, "API writes from the operator's start until every backlog node is cordoned (apiserver_request_total, every client)", r.BacklogWrites, n)
		p("")
		p("| The burst against its floor: the apiserver must take the N creates and the N cordons | Time | |")
		p("|---|---:|---:|")
		p("| Creates alone + raw cordons (same run) | %s | |", dur(r.BacklogCreates+r.Raw))
		p("| **Burst / (creates alone + raw)** | **%.2f×** | |", ratio(r.Operator, r.BacklogCreates+r.Raw))
		p("")
	}
	r.cpuTable(p)
	if len(r.Latency) > 0 {
		s := append([]time.Duration(nil), r.Latency...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		p("| Single event → node cordoned, at steady state (K=%d fresh nodes, one at a time) | p50 | p90 | p99 | max |", len(s))
		p("|---|---:|---:|---:|---:|")
		p("| Event created → node seen cordoned in a watch | %s | %s | %s | %s |", dur(percentile(s, 0.50)), dur(percentile(s, 0.90)), dur(percentile(s, 0.99)), dur(s[len(s)-1]))
		p("")
	}
	if r.Wave != nil {
		r.Wave.markdown(p)
	}
	writesTable(p, "API writes per node to reach Quarantined (apiserver_request_total, burst)", r.Writes, n)
	if c := r.OperatorWrites[operatorKey]; c != nil {
		p("| of which the operator's own client (its rest_client_requests_total) | %s | %.0f | %.2f |", verbs(c), c.total(), c.total()/n)
	}
	p("")
	if len(r.Reads) > 0 {
		p("| Uncached reads per node over the same interval (GET/LIST that reached the apiserver) | Verbs | Reads | Per node |")
		p("|---|---|---:|---:|")
		for _, k := range sortedKeys(r.Reads) {
			c := r.Reads[k]
			p("| `%s` | %s | %.0f | %.2f |", k, verbs(c), c.total(), c.total()/n)
		}
		p("")
	}
	p("Writes are counted from just before the burst until every NodeHealth is Quarantined, by every client (the operator, kube-controller-manager, kwok), less the harness's own %d event creates.", r.HarnessCreates)
	p("")
	r.perTransitionTable(p)
	return b.String()
}

// skipped lists the phases this size did not run, "none" when it ran all.
func (r *results) skipped() string {
	if len(r.Skipped) == 0 {
		return "none"
	}
	return strings.Join(r.Skipped, "; ")
}

// transitions is what the per-transition rows divide by: the burst's
// Healthy → Quarantined transitions in the NodeHealth histories, or N
// where none were counted (one per node).
func (r *results) transitions() float64 {
	if r.Transitions > 0 {
		return float64(r.Transitions)
	}
	return float64(r.N)
}

// writesPerTransition is the burst's API writes per transition, kwok's
// heartbeats left out.
func (r *results) writesPerTransition() float64 {
	return withoutHeartbeats(byResource(r.Writes)) / r.transitions()
}

// bytesPerTransition is the bytes of the burst's write request bodies per
// transition, kwok's heartbeats left out; NaN when the apiserver has no
// body size histogram.
func (r *results) bytesPerTransition() float64 {
	if r.BodyMetric == "" {
		return math.NaN()
	}
	return withoutHeartbeats(byResource(r.BodyBytes)) / r.transitions()
}

// perTransitionTable prints the burst's API writes and the bytes of their
// bodies by resource, per Healthy → Quarantined transition. Subresources
// are folded into their resource, as the body size histogram has none.
func (r *results) perTransitionTable(p func(string, ...any)) {
	t := r.transitions()
	writes, body := byResource(r.Writes), byResource(r.BodyBytes)
	cell := func(b float64) string {
		if r.BodyMetric == "" {
			return "n/a"
		}
		return bytesOf(b)
	}
	p("| API writes and bytes written per Healthy → Quarantined transition (burst, %.0f transitions; every client, less the harness's %d event creates and their %s) | writes | bytes written | writes / transition | bytes / transition |", t, r.HarnessCreates, bytesOf(r.HarnessBytes))
	p("|---|---:|---:|---:|---:|")
	for _, k := range sortResources(keysOf(writes, body)) {
		name := "`" + k.String() + "`"
		if isHeartbeat(k) {
			name += " (kwok node heartbeats; not in the total)"
		}
		p("| %s | %.0f | %s | %.2f | %s |", name, writes[k], cell(body[k]), writes[k]/t, cell(body[k]/t))
	}
	w, b := withoutHeartbeats(writes), withoutHeartbeats(body)
	p("| **Total** | **%.0f** | **%s** | **%.2f** | **%s** |", w, cell(b), w/t, cell(b/t))
	p("")
	if r.BodyMetric == "" {
		p("The apiserver exposes no request body size histogram (%s or %s): no bytes.", bodySizeMetrics[0].name, bodySizeMetrics[1].name)
	} else {
		p("Bytes are the write requests' bodies as the apiserver read them (`%s`, its _sum by resource and verb), over the same interval as the writes; the transitions are those the NodeHealth histories hold.", r.BodyMetric)
	}
	p("")
}

// startTable prints what the apiserver sent from just before the
// operator's start until every NodeHealth was Healthy, by resource: LIST
// responses, and watch events to every watcher.
func (r *results) startTable(p func(string, ...any)) {
	s, n := r.Start, float64(r.N)
	lists, listBytes := byResource(s.lists), byResource(s.listBytes)
	events, watchBytes := byResource(s.watchEvents), byResource(s.watchBytes)
	p("| Sent by the apiserver from the operator's start until every NodeHealth was Healthy (%s), by resource | LIST responses | LIST bytes | … per node | watch events (every watcher) | watch bytes | … per node |", dur(r.Steady))
	p("|---|---:|---:|---:|---:|---:|---:|")
	for _, k := range sortResources(keysOf(listBytes, watchBytes)) {
		name := "`" + k.String() + "`"
		if isHeartbeat(k) {
			name += " (kwok node heartbeats; not in the total)"
		}
		p("| %s | %.0f | %s | %s | %.0f | %s | %s |", name, lists[k], bytesOf(listBytes[k]), bytesOf(listBytes[k]/n), events[k], bytesOf(watchBytes[k]), bytesOf(watchBytes[k]/n))
	}
	lb, wb := withoutHeartbeats(listBytes), withoutHeartbeats(watchBytes)
	p("| **Total** | **%.0f** | **%s** | **%s** | **%.0f** | **%s** | **%s** |", withoutHeartbeats(lists), bytesOf(lb), bytesOf(lb/n), withoutHeartbeats(events), bytesOf(wb), bytesOf(wb/n))
	p("")
	p("LIST bytes are `apiserver_response_sizes` (verb LIST) as written to the connection, gzip-compressed where the client accepts it and the response passes 128 KiB; watch bytes are `apiserver_watch_events_sizes`, every event to every watcher: the operator's, and those of every other process for the objects that changed meanwhile (the operator's NodeHealths among them). With client-go's WatchListClient (on by default since 1.35) an informer's initial list streams as watch events, not as a LIST.")
	p("")
}

// keysOf returns the keys of every map, once each.
func keysOf[K comparable, V any, M ~map[K]V](maps ...M) []K {
	seen := map[K]bool{}
	var out []K
	for _, m := range maps {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	return out
}

// withoutHeartbeats sums by-resource totals, kwok's heartbeats left out.
func withoutHeartbeats(m map[resKey]float64) float64 {
	t := 0.0
	for k, v := range m {
		if !isHeartbeat(k) {
			t += v
		}
	}
	return t
}

func orNA(s string) string {
	if s == "" {
		return "n/a"
	}
	return s
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(l)
}

// cpuTable prints the CPU every process used in each timed phase, and how
// busy that kept the machine: where it is near 100%, the phase's wall time
// is the CPU it took, spread over the cores.
func (r *results) cpuTable(p func(string, ...any)) {
	if r.CPURaw.total() == 0 || r.CPUBurst == nil || r.Raw <= 0 || r.Operator <= 0 {
		return
	}
	type phase struct {
		name string
		cpu  cpuSnapshot
		wall time.Duration
	}
	phases := []phase{{"raw", r.CPURaw, r.Raw}, {"burst", r.CPUBurst, r.Operator}}
	if r.CPUCreates != nil && r.CPUBacklog != nil {
		phases = append(phases, phase{"creates alone", r.CPUCreates, r.BacklogCreates}, phase{"backlog", r.CPUBacklog, r.Backlog})
	}
	head, sep := "| CPU seconds by process (user + system, from /proc), until every node is seen cordoned |", "|---|"
	snaps := make([]cpuSnapshot, len(phases))
	for i, ph := range phases {
		head += " " + ph.name + " |"
		sep += "---:|"
		snaps[i] = ph.cpu
	}
	p("%s", head)
	p("%s", sep)
	for _, g := range cpuRows(snaps...) {
		row := "| " + g + " |"
		for _, ph := range phases {
			row += fmt.Sprintf(" %.1f |", ph.cpu[g])
		}
		p("%s", row)
	}
	total, busy := "| **total** |", "| wall time · machine busy (total ÷ (cores × wall)) |"
	for _, ph := range phases {
		total += fmt.Sprintf(" **%.1f** |", ph.cpu.total())
		busy += fmt.Sprintf(" %s · %.0f%% |", dur(ph.wall), 100*ph.cpu.total()/(float64(r.NProc)*ph.wall.Seconds()))
	}
	p("%s", total)
	p("%s", busy)
	p("")
	// With the machine this busy, wall time follows CPU: the burst's CPU
	// without the operator's is what the same burst would take with an
	// operator that cost nothing.
	all, others := r.CPUBurst.total()/r.CPURaw.total(), (r.CPUBurst.total()-r.CPUBurst["gpuhealth-operator"])/r.CPURaw.total()
	p("| Burst CPU ÷ raw CPU (the machine is busy in both, so wall time follows CPU) | |")
	p("|---|---:|")
	p("| every process (compare the measured ratio, %.2f×) | %.2f× |", r.ratio(), all)
	p("| every process but the operator: the ratio an operator that used no CPU would get | %.2f× |", others)
	p("| the operator's share of the burst's CPU | %.0f%% |", 100*r.CPUBurst["gpuhealth-operator"]/r.CPUBurst.total())
	p("")
}

// writesTable prints write counters by resource, per node of n, with
// kwok's heartbeats shown but left out of the total.
func writesTable(p func(string, ...any), title string, w reqCounts, n float64) {
	p("| %s | Verbs | Writes | Per node |", title)
	p("|---|---|---:|---:|")
	total := 0.0
	for _, k := range sortedKeys(w) {
		c := w[k]
		name := "`" + k.String() + "`"
		if isHeartbeat(k) {
			name += " (kwok node heartbeats; not in the total)"
		} else {
			total += c.total()
		}
		p("| %s | %s | %.0f | %.2f |", name, verbs(c), c.total(), c.total()/n)
	}
	p("| **Total** | | **%.0f** | **%.2f** |", total, total/n)
}

// sortedKeys returns the resources of c by name, kwok's heartbeats last.
func sortedKeys(c reqCounts) []resKey {
	keys := make([]resKey, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return sortResources(keys)
}

// sortResources sorts keys by name, kwok's heartbeats last, and returns them.
func sortResources(keys []resKey) []resKey {
	sort.Slice(keys, func(i, j int) bool {
		if isHeartbeat(keys[i]) != isHeartbeat(keys[j]) {
			return !isHeartbeat(keys[i])
		}
		return keys[i].String() < keys[j].String()
	})
	return keys
}

// addLogErrors adds the error lines of one operator process's log.
func (r *results) addLogErrors(op *operator) {
	n, first, shutdown := op.logErrors()
	r.OperatorErrors += n
	r.OperatorShutdownErrors += shutdown
	if r.OperatorErrorSample == "" {
		r.OperatorErrorSample = first
	}
}
