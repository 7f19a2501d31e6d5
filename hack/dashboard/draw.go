package main

import (
	"fmt"
	"image/color"
	"io"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Layout of the picture: three panels a row, each 6 × 4 inches at 96 dpi
// (1728 pixels wide), legible on a laptop screen at full width.
const (
	columns     = 3
	tileWidth   = 6 * vg.Inch
	tileHeight  = 4 * vg.Inch
	titleHeight = 0.5 * vg.Inch
	dpi         = 96
	// maxLegend is how many series a panel's legend names; more would
	// cover the plot (the lines are drawn all the same).
	maxLegend = 8
)

// drawGrid draws the panels of row into one PNG grid, under a title that
// names the recording's span, and writes it to w.
func drawGrid(w io.Writer, row string, ps []panel, span time.Duration) error {
	rows := (len(ps) + columns - 1) / columns
	img := vgimg.NewWith(vgimg.UseWH(columns*tileWidth, vg.Length(rows)*tileHeight+titleHeight), vgimg.UseDPI(dpi))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Path())

	title := draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, 16), Handler: plot.DefaultTextHandler, XAlign: draw.XCenter, YAlign: draw.YCenter}
	dc.FillText(title, vg.Point{X: dc.Center().X, Y: dc.Max.Y - titleHeight/2},
		fmt.Sprintf("gpuhealth dashboard, row %s: %s of recorded metrics", row, span.Round(time.Second)))

	grid := make([][]*plot.Plot, rows)
	for r := range grid {
		grid[r] = make([]*plot.Plot, columns)
	}
	for i := range ps {
		p, err := ps[i].plot(span.Minutes())
		if err != nil {
			return err
		}
		grid[i/columns][i%columns] = p
	}
	body := dc
	body.Max.Y -= titleHeight
	tiles := draw.Tiles{Rows: rows, Cols: columns, PadTop: 4, PadBottom: 4, PadLeft: 4, PadRight: 8, PadX: 12, PadY: 12}
	canvases := plot.Align(grid, tiles, body)
	for r, row := range grid {
		for c, p := range row {
			if p != nil {
				p.Draw(canvases[r][c])
			}
		}
	}
	_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

// plot is the panel as a line chart: its title, time in minutes from the
// recording's start to its end (minutes long), a line a series (broken
// where the series has no sample), or "no data".
func (p *panel) plot(minutes float64) (*plot.Plot, error) {
	pl := plot.New()
	pl.Title.Text = p.title
	if len(p.series) == 0 {
		return noData(pl)
	}
	pl.X.Label.Text = "minutes from start"
	scale, label := unitScale(p.unit)
	pl.Y.Label.Text = label
	pl.Legend.Left = true
	pl.Legend.Top = !p.mostlyHigh()
	pl.Add(plotter.NewGrid())
	for i, s := range p.series {
		for j, seg := range segments(s.points) {
			xys := make(plotter.XYs, len(seg))
			for k, pt := range seg {
				xys[k] = plotter.XY{X: pt[0], Y: pt[1] * scale}
			}
			line, err := plotter.NewLine(xys)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p.title, err)
			}
			line.Color = plotutil.Color(i)
			line.Width = vg.Points(1.5)
			pl.Add(line)
			if j == 0 && i < maxLegend {
				pl.Legend.Add(s.name, line)
			}
		}
	}
	if n := len(p.series); n > maxLegend {
		pl.Title.Text += fmt.Sprintf(" (%d series, %d named)", n, maxLegend)
	}
	pl.X.Min, pl.X.Max = 0, max(minutes, pl.X.Max)
	if p.unit == "percentunit" {
		pl.Y.Min, pl.Y.Max = 0, 100
	} else {
		// Room above the lines for the legend.
		pl.Y.Min, pl.Y.Max = min(pl.Y.Min, 0), max(pl.Y.Max*legendRoom, 1)
	}
	return pl, nil
}

// legendRoom is the factor the y axis reaches over the highest point,
// leaving the legend room above the lines.
const legendRoom = 1.4

// mostlyHigh says whether most of the panel's points lie in the upper
// half of its range (goodput near 100%), where a legend on top would
// cover them.
func (p *panel) mostlyHigh() bool {
	if p.unit != "percentunit" {
		return false
	}
	high, n := 0, 0
	for _, s := range p.series {
		for _, pt := range s.points {
			n++
			if pt[1] > 0.5 {
				high++
			}
		}
	}
	return 2*high > n
}

// noData is pl with "no data" where the lines would be.
func noData(pl *plot.Plot) (*plot.Plot, error) {
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: 0.5, Y: 0.5}}, Labels: []string{"no data"}})
	if err != nil {
		return nil, err
	}
	for i := range l.TextStyle {
		l.TextStyle[i].XAlign, l.TextStyle[i].YAlign = draw.XCenter, draw.YCenter
		l.TextStyle[i].Color = color.Gray{Y: 0x80}
	}
	pl.Add(l)
	pl.X.Min, pl.X.Max, pl.Y.Min, pl.Y.Max = 0, 1, 0, 1
	pl.HideAxes()
	return pl, nil
}

// unitScale is the factor and axis label a Grafana unit is drawn with.
func unitScale(unit string) (float64, string) {
	switch unit {
	case "percentunit":
		return 100, "%"
	case "s":
		return 1, "seconds"
	default:
		return 1, ""
	}
}

// gapFactor is how many mean point spacings apart two points may be and
// still be joined: a longer gap is a time without samples.
const gapFactor = 1.5

// segments splits points (in time order, at a regular step) where a step
// is missing, so a line does not bridge a time the series did not exist.
func segments(points [][2]float64) [][][2]float64 {
	if len(points) < 2 {
		return [][][2]float64{points}
	}
	step := points[1][0] - points[0][0]
	for i := 2; i < len(points); i++ {
		step = min(step, points[i][0]-points[i-1][0])
	}
	var out [][][2]float64
	from := 0
	for i := 1; i < len(points); i++ {
		if points[i][0]-points[i-1][0] > gapFactor*step {
			out = append(out, points[from:i])
			from = i
		}
	}
	return append(out, points[from:])
}
