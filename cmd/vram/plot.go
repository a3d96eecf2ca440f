// Drawing a replay: live and reserved bytes over the trace, one reserved
// line per allocator, with gonum/plot.

package main

import (
	"fmt"
	"image/color"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
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
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "event"
	p.Y.Label.Text = "MiB"
	p.Legend.Top = true
	p.Add(plotter.NewGrid())

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
	add := func(name string, xs, ys []float64, c color.Color, dashed bool) error {
		line, err := plotter.NewLine(downsample(xs, ys))
		if err != nil {
			return fmt.Errorf("plot %s: %s: %w", path, name, err)
		}
		line.Color = c
		line.Width = vg.Points(1.2)
		if dashed {
			line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(line)
		p.Legend.Add(name, line)
		return nil
	}
	if sameLive {
		if err := add("live", lines[0].Events, lines[0].Live, color.Black, true); err != nil {
			return err
		}
	}
	for i, l := range lines {
		c := palette[i%len(palette)]
		if err := add(l.Allocator+" reserved", l.Events, l.Reserved, c, false); err != nil {
			return err
		}
		if !sameLive {
			if err := add(l.Allocator+" live", l.Events, l.Live, c, true); err != nil {
				return err
			}
		}
	}
	p.Y.Min = 0
	if err := p.Save(8*vg.Inch, 4.5*vg.Inch, path); err != nil {
		return fmt.Errorf("write plot %s: %w", path, err)
	}
	return nil
}

// downsample returns at most maxPlotPoints points in MiB, each the maximum
// of its bucket of events.
func downsample(xs, ys []float64) plotter.XYs {
	n := len(xs)
	if n <= maxPlotPoints {
		pts := make(plotter.XYs, n)
		for i := range n {
			pts[i] = plotter.XY{X: xs[i], Y: ys[i] / (1 << 20)}
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
		pts = append(pts, plotter.XY{X: xs[hi-1], Y: top / (1 << 20)})
	}
	return pts
}
