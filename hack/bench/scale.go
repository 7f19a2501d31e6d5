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
// and the N cordons alone, measured in the same run.
func (r *results) floor() time.Duration { return r.BacklogCreates + r.Raw }

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
	if r.RSSIdle != nil {
		p("| Memory (RSS, MiB) and CPU by process | RSS idle | peak after the burst | RSS at the end | CPU idle (%s) | CPU burst |", dur(r.idleWindow()))
		p("|---|---:|---:|---:|---:|---:|")
		for _, g := range scaleGroups {
			p("| %s | %.0f | %.0f | %.0f | %s | %.1f s |", g, r.RSSIdle[g]/mib, r.RSSPeak[g]/mib, r.RSSEnd[g]/mib, idleCPU(r.CPUIdle[g], r.idleWindow()), r.CPUBurst[g])
		}
		p("")
		p("RSS is VmRSS summed over a group's processes; the peak is the largest process's VmHWM; the end is after the backlog, with the restarted operator (its peak: %.0f MiB).", r.RSSBacklogPeak["gpuhealth-operator"]/mib)
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
	p("| N (nodes / pods) | raw | creates alone | burst | **burst / floor** | backlog | cache sync | operator RSS idle / peak | kube-scheduler RSS | kube-controller-manager RSS | operator CPU idle / burst |")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range all {
		p("| %d / %d | %s | %s | %s | **%.2f×** | %s | %s | %.0f / %.0f MiB | %.0f MiB | %.0f MiB | %s / %.1f s |",
			r.N, r.N*r.PodsPerNode, dur(r.Raw), dur(r.BacklogCreates), dur(r.Operator), ratio(r.Operator, r.floor()), dur(r.Backlog), dur(r.CacheSync),
			r.RSSIdle["gpuhealth-operator"]/mib, r.RSSPeak["gpuhealth-operator"]/mib, r.RSSPeak["kube-scheduler"]/mib, r.RSSPeak["kube-controller-manager"]/mib,
			idleCPU(r.CPUIdle["gpuhealth-operator"], r.Idle), r.CPUBurst["gpuhealth-operator"])
	}
	first, last := all[0], all[len(all)-1]
	p("")
	p("| Linearity, N = %d against N = %d (%.1f× the nodes) | ratio |", last.N, first.N, float64(last.N)/float64(first.N))
	p("|---|---:|")
	p("| burst time | %.2f× |", ratio(last.Operator, first.Operator))
	p("| floor (creates alone + raw) | %.2f× |", ratio(last.floor(), first.floor()))
	p("| backlog | %.2f× |", ratio(last.Backlog, first.Backlog))
	p("| operator RSS at peak | %.2f× |", last.RSSPeak["gpuhealth-operator"]/first.RSSPeak["gpuhealth-operator"])
	return b.String()
}

// plotCurve draws time (burst, floor, backlog) and memory (operator,
// kube-scheduler, kube-controller-manager peaks) against N, side by side.
func plotCurve(all []*results, path string) error {
	xy := func(f func(*results) float64) plotter.XYs {
		out := make(plotter.XYs, len(all))
		for i, r := range all {
			out[i] = plotter.XY{X: float64(r.N), Y: f(r)}
		}
		return out
	}
	timePlot := plot.New()
	timePlot.Title.Text = "Cordon every node: time against N"
	timePlot.X.Label.Text = "nodes (N)"
	timePlot.Y.Label.Text = "seconds"
	memPlot := plot.New()
	memPlot.Title.Text = "Peak memory (RSS) against N"
	memPlot.X.Label.Text = "nodes (N), 10 pods each"
	memPlot.Y.Label.Text = "MiB"
	colors := []color.Color{color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 255}, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 255}, color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 255}}
	add := func(pl *plot.Plot, series []struct {
		name string
		f    func(*results) float64
	}) error {
		pl.Add(plotter.NewGrid())
		for i, s := range series {
			line, points, err := plotter.NewLinePoints(xy(s.f))
			if err != nil {
				return err
			}
			line.Color, points.Color = colors[i%len(colors)], colors[i%len(colors)]
			line.Width = vg.Points(1.5)
			pl.Add(line, points)
			pl.Legend.Add(s.name, line, points)
		}
		pl.Legend.Top, pl.Legend.Left = true, true
		pl.Y.Min = 0
		return nil
	}
	type series = struct {
		name string
		f    func(*results) float64
	}
	if err := add(timePlot, []series{
		{"gpuhealth burst", func(r *results) float64 { return r.Operator.Seconds() }},
		{"apiserver floor (creates + raw cordons)", func(r *results) float64 { return r.floor().Seconds() }},
		{"backlog after a restart", func(r *results) float64 { return r.Backlog.Seconds() }},
	}); err != nil {
		return err
	}
	if err := add(memPlot, []series{
		{"gpuhealth-operator", func(r *results) float64 { return r.RSSPeak["gpuhealth-operator"] / mib }},
		{"kube-scheduler", func(r *results) float64 { return r.RSSPeak["kube-scheduler"] / mib }},
		{"kube-controller-manager", func(r *results) float64 { return r.RSSPeak["kube-controller-manager"] / mib }},
	}); err != nil {
		return err
	}
	const w, hgt = 6 * vg.Inch, 4 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(2*w, hgt), vgimg.UseDPI(96))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align([][]*plot.Plot{{timePlot, memPlot}}, tiles, dc)
	timePlot.Draw(canvases[0][0])
	memPlot.Draw(canvases[0][1])
	return savePNG(img, path)
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
