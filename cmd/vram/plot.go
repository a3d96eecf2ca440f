// Drawing a replay: live and reserved bytes over the trace, one reserved
// line per allocator, with gonum/plot.

package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/vramkit/vram/internal/userfile"
)

// plotFormats are the file extensions --plot writes.
var plotFormats = []string{".png", ".svg"}

// checkPlotPath refuses a --plot file whose extension is not a format we
// write, before any work is done.
func checkPlotPath(path string) error {
	ext := strings.ToLower(filepath.Ext(path))
	if !slices.Contains(plotFormats, ext) {
		return usagef("--plot %q: want a file ending in %s", path, strings.Join(plotFormats, " or "))
	}
	return nil
}

// timeline is one allocator's memory over a replay: after event Events[i],
// Live[i] bytes were in live allocations and Reserved[i] held from the
// device.
type timeline struct {
	Allocator string
	Events    []float64
	Live      []float64
	Reserved  []float64
}

// maxPlotPoints bounds the points drawn per line; longer timelines are
// reduced to the maximum of each bucket, so peaks survive.
const maxPlotPoints = 2000

// plotTimelines draws the timelines into path (PNG or SVG by extension).
func plotTimelines(path, title string, lines []timeline) error {
	if len(lines) == 0 {
		return fmt.Errorf("plot %s: nothing to draw", path)
	}
	// Bytes are drawn in the unit that suits the largest value.
	top, lastEvent := timelineExtent(lines)
	unit, scale := plotUnit(top)
	p := newTimelinePlot(title, unit)

	// Live bytes are the trace's own and the same for every allocator
	// unless one failed allocations; draw one live line when they agree.
	sameLive := true
	for _, l := range lines[1:] {
		if !slices.Equal(l.Live, lines[0].Live) {
			sameLive = false
		}
	}
	palette := []color.Color{
		color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
		color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
		color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
		color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	}
	entries := 0
	add := func(name string, xs, ys []float64, c color.Color, dashed bool, width vg.Length) error {
		line, err := plotter.NewLine(downsample(xs, ys, scale))
		if err != nil {
			return fmt.Errorf("plot %s: %s: %w", path, name, err)
		}
		line.Color = c
		line.Width = width
		if dashed {
			line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(line)
		p.Legend.Add(name, line)
		entries++
		return nil
	}
	if sameLive {
		if err := add("live", lines[0].Events, lines[0].Live, color.Black, true, vg.Points(1.4)); err != nil {
			return err
		}
	}
	for i, l := range lines {
		c := palette[i%len(palette)]
		// Each line is drawn thinner than the one before, over it, so
		// that lines which coincide (two pools reserving the same) stay
		// visible as a border around the other.
		width := vg.Points(1.2 + 0.8*float64(len(lines)-1-i))
		if err := add(l.Allocator+" reserved", l.Events, l.Reserved, c, false, width); err != nil {
			return err
		}
		if !sameLive {
			if err := add(l.Allocator+" live", l.Events, l.Live, c, true, width); err != nil {
				return err
			}
		}
	}
	// Room above the lines for the legend, so that it hides no data.
	p.X.Min, p.X.Max = 0, max(lastEvent, 1)
	p.Y.Min = 0
	p.Y.Max = max(top/scale, 1) * (1 + 0.09*float64(entries) + 0.05)
	p.Y.Tick.Marker = byteTicks{}
	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(path)), ".")
	wt, err := p.WriterTo(9*vg.Inch, 5*vg.Inch, format)
	if err != nil {
		return fmt.Errorf("write plot %s: %w", path, err)
	}
	if err := userfile.Write(path, userfile.Options{}, func(w io.Writer) error { _, err := wt.WriteTo(w); return err }); err != nil {
		return fmt.Errorf("write plot %s: %w", path, err)
	}
	return nil
}

// timelineExtent is the largest byte count and the last event of lines.
func timelineExtent(lines []timeline) (top, lastEvent float64) {
	for _, l := range lines {
		if len(l.Reserved) > 0 {
			top = max(top, slices.Max(l.Reserved), slices.Max(l.Live))
		}
		if len(l.Events) > 0 {
			lastEvent = max(lastEvent, l.Events[len(l.Events)-1])
		}
	}
	return top, lastEvent
}

// newTimelinePlot is an empty plot of bytes in unit over events, with its
// title, axes, legend and grid styled.
func newTimelinePlot(title, unit string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(13)
	p.Title.Padding = vg.Points(8)
	p.X.Label.Text = "event (allocations and frees, in log order)"
	p.Y.Label.Text = "bytes (" + unit + ")"
	for _, ax := range []*plot.Axis{&p.X, &p.Y} {
		ax.Label.TextStyle.Font.Size = vg.Points(12)
		ax.Tick.Label.Font.Size = vg.Points(11)
	}
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(11)
	p.Legend.Padding = vg.Points(2)
	p.Legend.ThumbnailWidth = vg.Points(24)
	p.Add(plotter.NewGrid())
	return p
}

// plotUnit picks the byte unit for an axis whose largest value is top,
// and how many bytes it is.
func plotUnit(top float64) (string, float64) {
	switch {
	case top >= 1<<40:
		return "TiB", 1 << 40
	case top >= 1<<30:
		return "GiB", 1 << 30
	case top >= 1<<20:
		return "MiB", 1 << 20
	case top >= 1<<10:
		return "KiB", 1 << 10
	}
	return "B", 1
}

// downsample returns at most maxPlotPoints points, bytes divided by
// scale, each the maximum of its bucket of events.
func downsample(xs, ys []float64, scale float64) plotter.XYs {
	n := len(xs)
	if n <= maxPlotPoints {
		pts := make(plotter.XYs, n)
		for i := range n {
			pts[i] = plotter.XY{X: xs[i], Y: ys[i] / scale}
		}
		return pts
	}
	pts := make(plotter.XYs, 0, maxPlotPoints)
	for b := range maxPlotPoints {
		lo, hi := b*n/maxPlotPoints, (b+1)*n/maxPlotPoints
		if hi <= lo {
			continue
		}
		top := slices.Max(ys[lo:hi])
		pts = append(pts, plotter.XY{X: xs[hi-1], Y: top / scale})
	}
	return pts
}

// byteTicks labels an axis at 4 to 10 round values (steps of 1, 2 or 5
// times a power of ten), so that a few GiB get more than two labels.
type byteTicks struct{}

// Ticks implements plot.Ticker.
func (byteTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return []plot.Tick{{Value: lo, Label: strconv.FormatFloat(lo, 'g', -1, 64)}}
	}
	step := math.Pow(10, math.Floor(math.Log10(hi-lo)))
	for _, f := range []float64{0.1, 0.2, 0.5, 1} {
		if (hi-lo)/(step*f) <= 10 {
			step *= f
			break
		}
	}
	digits := max(0, int(-math.Floor(math.Log10(step)+1e-9)))
	var ticks []plot.Tick
	for i := math.Ceil(lo / step); i*step <= hi+step*1e-9; i++ {
		v := i * step
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', digits, 64)})
	}
	return ticks
}
