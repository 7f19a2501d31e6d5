package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

const mib = 1 << 20

// scaleGroups are the processes whose memory and CPU the scale tables
// compare, in order.
var scaleGroups = []string{"gpuhealth-operator", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd", "kwok"}

// floor is what the apiserver must take for a burst: the N creates alone
// and the N cordons alone, measured in the same run; zero when the
// backlog, which times the creates alone, did not run.
func (r *results) floor() time.Duration {
	if r.BacklogCreates <= 0 {
		return 0
	}
	return r.BacklogCreates + r.Raw
}

// scaleMarkdown renders the rows the scale curve adds to one size's run:
// setup, cache sync, memory and idle CPU by process, and the detection
// samples through real monitors.
func (r *results) scaleMarkdown(p func(string, ...any)) {
	p("| Cluster and operator | |")
	p("|---|---:|")
	if r.PodsPerNode > 0 {
		how := "bound to their nodes by the harness, run by kwok"
		if r.PodsScheduled {
			how = "one Deployment, placed by kube-scheduler"
		}
		p("| workload pods (%d per node, %s) Running after | %d in %s |", r.PodsPerNode, how, r.N*r.PodsPerNode, dur(r.PodsReady))
	}
	p("| operator start → caches of its %d controllers synced | %s |", r.Controllers, dur(r.CacheSync))
	if r.BacklogCacheSync > 0 {
		p("| … the restarted operator in the backlog | %s |", dur(r.BacklogCacheSync))
	}
	p("| operator start → every NodeHealth Healthy | %s |", dur(r.Steady))
	p("")
	r.startTable(p)
	r.heapTable(p)
	if r.RSSIdle != nil {
		p("| Memory (RSS, MiB) and CPU by process | RSS idle | peak after the burst | RSS at the end | CPU idle (%s) | CPU burst |", dur(r.idleWindow()))
		p("|---|---:|---:|---:|---:|---:|")
		for _, g := range scaleGroups {
			p("| %s | %.0f | %.0f | %.0f | %s | %.1f s |", g, r.RSSIdle[g]/mib, r.RSSPeak[g]/mib, r.RSSEnd[g]/mib, idleCPU(r.CPUIdle[g], r.idleWindow()), r.CPUBurst[g])
		}
		p("")
		end := "after the last phase, with the same operator"
		if r.Backlog > 0 {
			end = fmt.Sprintf("after the backlog, with the restarted operator (its peak: %.0f MiB)", r.RSSBacklogPeak["gpuhealth-operator"]/mib)
		}
		p("RSS is VmRSS summed over a group's processes; the peak is the largest process's VmHWM; the end is %s.", end)
		p("")
	}
	if m := r.MemBurst; m.Samples > 0 {
		pk := m.Peak
		limit := "none"
		if m.Limit > 0 {
			limit = fmt.Sprintf("container limit %.0f MiB", m.Limit/mib)
		}
		if pk.SoftLimit > 0 && pk.SoftLimit < math.MaxInt64/2 {
			limit += fmt.Sprintf(", the runtime's soft limit %.0f MiB", pk.SoftLimit/mib)
		}
		p("| The operator's memory in the burst (RSS read %d times, every 250 ms; the runtime's statistics %d times, at a new RSS high, at most every %s; memory limit: %s) | MiB |", m.Samples, m.Scrapes, dur(scrapeEvery), limit)
		p("|---|---:|")
		p("| RSS at its largest (%s into the burst) | %.0f |", dur(m.PeakAt), m.PeakRSS/mib)
		p("| RSS at the read of the runtime's statistics nearest it (%s into the burst) | %.0f |", dur(pk.At), pk.RSS/mib)
		p("| … Go heap allocated then: live objects and garbage not yet collected | %.0f |", pk.HeapAlloc/mib)
		p("| … heap spans in use | %.0f |", pk.HeapInuse/mib)
		p("| … heap kept mapped, not in use and not returned to the kernel | %.0f |", (pk.HeapIdle-pk.HeapReleased)/mib)
		p("| … goroutine stacks | %.0f |", pk.Stack/mib)
		p("| … the GC's goal then (the heap at which the running cycle ends) | %.0f |", pk.NextGC/mib)
		p("| largest heap allocated at any read · largest GC goal | %.0f · %.0f |", m.MaxAlloc/mib, m.MaxGoal/mib)
		p("| garbage collections in the burst | %.0f |", m.GCs)
		p("")
	}
	if len(r.Detect) > 0 {
		s := sortedDurations(r.Detect)
		p("| Detection → cordon through real monitors (%d XIDs, %d monitors at a time, each on a fresh node) | p50 | p90 | p99 | max |", len(s), r.DetectMonitors)
		p("|---|---:|---:|---:|---:|")
		p("| XID delivered by NVML (fake library, go-nvml's real path) → node seen cordoned in a watch | %s | %s | %s | %s |", dur(percentile(s, 0.50)), dur(percentile(s, 0.90)), dur(percentile(s, 0.99)), dur(s[len(s)-1]))
		p("")
	}
}

func (r *results) idleWindow() time.Duration { return r.Idle }

// heapTable prints the operator's memory at steady state, in all and per
// 1,000 nodes: how it grows with the fleet.
func (r *results) heapTable(p func(string, ...any)) {
	h := r.Heap
	if h.Live <= 0 {
		return
	}
	p("| The operator at steady state (N = %d, after the idle window, a collection forced) | in all | per 1,000 nodes |", r.N)
	p("|---|---:|---:|")
	p("| Go live heap (HeapAlloc just after the collection) | %.1f MiB | **%.1f MiB** |", h.Live/mib, r.perThousand(h.Live)/mib)
	p("| heap spans in use | %.1f MiB | %.1f MiB |", h.Inuse/mib, r.perThousand(h.Inuse)/mib)
	p("| RSS | %.0f MiB | **%.1f MiB** |", h.RSS/mib, r.perThousand(h.RSS)/mib)
	p("")
	p("Per 1,000 nodes is the whole ÷ (N / 1,000), the process's fixed base included, which dominates at small N; the scale curve gives the growth between sizes.")
	p("")
}

// perThousand is v per 1,000 of the N nodes.
func (r *results) perThousand(v float64) float64 { return v / (float64(r.N) / 1000) }

// startBytesPerNode are the bytes the apiserver sent in LIST responses
// and in watch events from the operator's start until steady state, per
// node, kwok's heartbeats left out.
func (r *results) startBytesPerNode() (list, watch float64) {
	n := float64(r.N)
	return withoutHeartbeats(byResource(r.Start.listBytes)) / n, withoutHeartbeats(byResource(r.Start.watchBytes)) / n
}

// idleCPU is CPU seconds over the window as a share of one core.
func idleCPU(sec float64, window time.Duration) string {
	if window <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", 100*sec/window.Seconds())
}

func sortedDurations(d []time.Duration) []time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s
}

// curveMarkdown is the scale curve: one row per size.
func curveMarkdown(all []*results) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("### Scale curve")
	p("")
	p("| N (nodes / pods) | raw | creates alone | burst | **burst / floor** | backlog | cache sync | operator RSS idle / peak | kube-scheduler RSS | kube-controller-manager RSS | operator CPU idle / burst | phases skipped |")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, r := range all {
		p("| %d / %d | %s | %s | %s | **%s** | %s | %s | %.0f / %.0f MiB | %.0f MiB | %.0f MiB | %s / %.1f s | %s |",
			r.N, r.N*r.PodsPerNode, dur(r.Raw), orSkipped(r.BacklogCreates), dur(r.Operator), times(ratio(r.Operator, r.floor())), orSkipped(r.Backlog), dur(r.CacheSync),
			r.RSSIdle["gpuhealth-operator"]/mib, r.RSSPeak["gpuhealth-operator"]/mib, r.RSSPeak["kube-scheduler"]/mib, r.RSSPeak["kube-controller-manager"]/mib,
			idleCPU(r.CPUIdle["gpuhealth-operator"], r.Idle), r.CPUBurst["gpuhealth-operator"], r.skipped())
	}
	p("")
	perNodeCurve(p, all)
	first, last := all[0], all[len(all)-1]
	p("")
	p("| Linearity, N = %d against N = %d (%.1f× the nodes) | ratio |", last.N, first.N, float64(last.N)/float64(first.N))
	p("|---|---:|")
	p("| burst time | %s |", times(ratio(last.Operator, first.Operator)))
	p("| floor (creates alone + raw) | %s |", times(ratio(last.floor(), first.floor())))
	p("| backlog | %s |", times(ratio(last.Backlog, first.Backlog)))
	p("| operator RSS at peak | %.2f× |", last.RSSPeak["gpuhealth-operator"]/first.RSSPeak["gpuhealth-operator"])
	p("| operator live heap at steady state | %.2f× |", last.Heap.Live/first.Heap.Live)
	if last.N == first.N {
		return b.String()
	}
	p("")
	p("| The operator's growth from N = %d to N = %d, per 1,000 nodes more (the process's fixed base left out) | |", first.N, last.N)
	p("|---|---:|")
	p("| live heap at steady state | %.1f MiB |", growth(first, last, first.Heap.Live, last.Heap.Live)/mib)
	p("| RSS at steady state | %.1f MiB |", growth(first, last, first.Heap.RSS, last.Heap.RSS)/mib)
	return b.String()
}

// growth is how much a value grew per 1,000 nodes from the run at first
// to the one at last.
func growth(first, last *results, from, to float64) float64 {
	return (to - from) / (float64(last.N-first.N) / 1000)
}

// perNodeCurve is the scale curve's second table: what each node costs
// and waits, against N.
func perNodeCurve(p func(string, ...any), all []*results) {
	p("| N | burst: finding → cordon p50 / p99 / max | API writes / transition | bytes written / transition | sent at start per node: LIST / watch | operator live heap / RSS per 1,000 nodes | fault wave: finding → drained p50 / p99 / max · whole |")
	p("|---|---:|---:|---:|---:|---:|---:|")
	for _, r := range all {
		b := spreadOf(r.BurstLatency)
		body := "n/a"
		if v := r.bytesPerTransition(); !math.IsNaN(v) {
			body = bytesOf(v)
		}
		list, watch := r.startBytesPerNode()
		p("| %d | %s / %s / %s | %.2f | %s | %s / %s | %.1f / %.1f MiB | %s |", r.N, dur(b.P50), dur(b.P99), dur(b.Max), r.writesPerTransition(), body,
			bytesOf(list), bytesOf(watch), r.perThousand(r.Heap.Live)/mib, r.perThousand(r.Heap.RSS)/mib, r.waveCell())
	}
}

// waveCell sums up the fault wave for the curve.
func (r *results) waveCell() string {
	w := r.Wave
	if w == nil {
		return "skipped"
	}
	s := spreadOf(w.PerNode)
	return fmt.Sprintf("%s / %s / %s · %s (%d nodes)", dur(s.P50), dur(s.P99), dur(s.Max), dur(w.Whole), w.Nodes)
}

// orSkipped is a phase's time, or "skipped" for a phase that did not run.
func orSkipped(d time.Duration) string {
	if d <= 0 {
		return "skipped"
	}
	return dur(d)
}

// times formats a ratio, "n/a" where a phase it needs did not run.
func times(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) || x <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", x)
}

// series is one curve of a panel: a value of each size's results, NaN
// where that size did not measure it.
type series struct {
	name string
	f    func(*results) float64
}

// panel is one plot of the scale curve's figure.
type panel struct {
	title, y string
	series   []series
}

// curveSeconds is a duration on a curve: seconds, NaN for a phase that
// did not run.
func curveSeconds(d time.Duration) float64 {
	if d <= 0 {
		return math.NaN()
	}
	return d.Seconds()
}

// curvePanels are the scale curve's plots: time to cordon every node,
// peak memory, each node's wait in the burst and the wave, the operator's
// memory per 1,000 nodes, and the API writes and bytes per transition.
func curvePanels() []panel {
	return []panel{
		{"Cordon every node: time against N", "seconds", []series{
			{"gpuhealth burst", func(r *results) float64 { return curveSeconds(r.Operator) }},
			{"apiserver floor (creates + raw cordons)", func(r *results) float64 { return curveSeconds(r.floor()) }},
			{"backlog after a restart", func(r *results) float64 { return curveSeconds(r.Backlog) }},
		}},
		{"Peak memory (RSS) against N", "MiB", []series{
			{"gpuhealth-operator", func(r *results) float64 { return r.RSSPeak["gpuhealth-operator"] / mib }},
			{"kube-scheduler", func(r *results) float64 { return r.RSSPeak["kube-scheduler"] / mib }},
			{"kube-controller-manager", func(r *results) float64 { return r.RSSPeak["kube-controller-manager"] / mib }},
		}},
		{"Each node: finding → cordon (burst), → drained (wave)", "seconds", []series{
			{"burst p50", func(r *results) float64 { return curveSeconds(spreadOf(r.BurstLatency).P50) }},
			{"burst p99", func(r *results) float64 { return curveSeconds(spreadOf(r.BurstLatency).P99) }},
			{"wave p50", func(r *results) float64 { return curveSeconds(r.waveSpread().P50) }},
			{"wave p99", func(r *results) float64 { return curveSeconds(r.waveSpread().P99) }},
		}},
		{"The operator per 1,000 nodes at steady state", "MiB", []series{
			{"live heap", func(r *results) float64 { return r.perThousand(r.Heap.Live) / mib }},
			{"RSS", func(r *results) float64 { return r.perThousand(r.Heap.RSS) / mib }},
		}},
		{"API writes per Healthy → Quarantined transition", "writes", []series{
			{"every client", func(r *results) float64 { return r.writesPerTransition() }},
		}},
		{"API bytes written per transition", "KiB", []series{
			{"request bodies, every client", func(r *results) float64 { return r.bytesPerTransition() / 1024 }},
		}},
	}
}

// waveSpread is the fault wave's per-node distribution (zeros when it did
// not run).
func (r *results) waveSpread() spread {
	if r.Wave == nil {
		return spread{}
	}
	return spreadOf(r.Wave.PerNode)
}

// curveColors tell a panel's series apart.
var curveColors = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 255}, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 255},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 255}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 255},
}

// plotCurve draws curvePanels against N, three to a row.
func plotCurve(all []*results, path string) error {
	panels := curvePanels()
	const cols = 3
	rows := (len(panels) + cols - 1) / cols
	plots := make([][]*plot.Plot, rows)
	for i, pn := range panels {
		pl, err := drawPanel(all, pn)
		if err != nil {
			return err
		}
		plots[i/cols] = append(plots[i/cols], pl)
	}
	for len(plots[rows-1]) < cols {
		plots[rows-1] = append(plots[rows-1], nil)
	}
	const w, hgt = 5 * vg.Inch, 3.75 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(cols*w, vg.Length(rows)*hgt), vgimg.UseDPI(96))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		for j, pl := range plots[i] {
			if pl != nil {
				pl.Draw(canvases[i][j])
			}
		}
	}
	return savePNG(img, path)
}

// drawPanel plots one panel's series against N, each without the sizes
// that did not measure it (a series none measured is left out).
func drawPanel(all []*results, pn panel) (*plot.Plot, error) {
	pl := plot.New()
	pl.Title.Text = pn.title
	pl.X.Label.Text = fmt.Sprintf("nodes (N), %d pods each", all[0].PodsPerNode)
	if all[0].PodsPerNode == 1 {
		pl.X.Label.Text = "nodes (N), 1 pod each"
	}
	pl.Y.Label.Text = pn.y
	// Every panel spans all the sizes, also where a series has fewer
	// points, so that the panels line up (adding a series only widens it).
	pl.X.Min, pl.X.Max = math.Inf(1), math.Inf(-1)
	for _, r := range all {
		pl.X.Min, pl.X.Max = min(pl.X.Min, float64(r.N)), max(pl.X.Max, float64(r.N))
	}
	pl.Add(plotter.NewGrid())
	for i, s := range pn.series {
		var xy plotter.XYs
		for _, r := range all {
			if v := s.f(r); !math.IsNaN(v) && !math.IsInf(v, 0) {
				xy = append(xy, plotter.XY{X: float64(r.N), Y: v})
			}
		}
		if len(xy) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(xy)
		if err != nil {
			return nil, err
		}
		c := curveColors[i%len(curveColors)]
		line.Color, points.Color = c, c
		line.Width = vg.Points(1.5)
		pl.Add(line, points)
		pl.Legend.Add(s.name, line, points)
	}
	pl.Legend.Top, pl.Legend.Left = true, true
	pl.Y.Min = 0
	return pl, nil
}

// savePNG writes the canvas to path as a PNG.
func savePNG(img *vgimg.Canvas, path string) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(f)
	return err
}
