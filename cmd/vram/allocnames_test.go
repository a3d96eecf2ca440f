package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
)

// allocAsk is one way of asking vram run for an allocator: --allocator
// (flag), or $VRAM_ALLOC_CONF (env), or neither.
type allocAsk struct{ flag, env string }

// allocAsks lists, for every allocator of the registry, every way of
// asking for it with the name it is served by on smallRun's device (which
// manages virtual memory): --allocator by its name and by each alias;
// $VRAM_ALLOC_CONF by its kind, with expandable:true|false to choose
// between the Pool kind's two; and, for every kind, $VRAM_ALLOC_CONF by
// the kind's name and each alias, served by the kind's choice.
func allocAsks(t *testing.T) map[allocAsk]string {
	t.Helper()
	asks := map[allocAsk]string{}
	for _, e := range alloc.Allocators() {
		for _, n := range append([]string{e.Name}, e.Aliases...) {
			asks[allocAsk{flag: n}] = e.Name
		}
		env := "kind:" + e.Kind.String()
		if len(e.Kind.Allocators()) > 1 {
			env += ",expandable:" + strconv.FormatBool(e.Name == alloc.NameExpandable)
		}
		asks[allocAsk{env: env}] = e.Name
	}
	dev, err := device.Open(smallRun[1])
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	for _, k := range alloc.Kinds() {
		served, err := k.Choose(dev)
		if err != nil {
			t.Fatal(err)
		}
		first := k.Allocators()[0]
		for _, n := range append([]string{first.Name}, first.Aliases...) {
			asks[allocAsk{env: "kind:" + n}] = served.Name
		}
	}
	return asks
}

var (
	reportLine  = regexp.MustCompile(`(?m)^allocator +([a-z_]+): `)
	managerLine = regexp.MustCompile(`(?m)^manager: ([a-z_]+) allocator, `)
	memoryLine  = regexp.MustCompile(`(?m)^([a-z_]+) memory report$`)
	metricLabel = regexp.MustCompile(`allocator="([^"]*)"`)
)

// TestAllocatorOneName: however an allocator is asked for (every name and
// alias of every allocator and kind, by --allocator and by
// $VRAM_ALLOC_CONF), the allocator that serves vram run has one name in
// all five places: the run report (text and JSON), -v's memory report
// (its manager line and its allocator's table), the metrics label, vram
// info (which lists it and describes it, and whose default is what run
// serves when nothing asks), and $VRAM_ALLOC_CONF, which takes the same
// names as --allocator for the kinds and serves what it names.
func TestAllocatorOneName(t *testing.T) {
	info := infoAllocators(t)
	asks := allocAsks(t)
	asks[allocAsk{}] = info.Default
	for ask, want := range asks {
		t.Run(fmt.Sprintf("flag %q env %q", ask.flag, ask.env), func(t *testing.T) {
			t.Setenv(vram.AllocConfEnv, ask.env)
			args := []string{"run", "-v", "--metrics-addr", "127.0.0.1:0"}
			if ask.flag != "" {
				args = append(args, "--allocator", ask.flag)
			}
			var out, errb bytes.Buffer
			var labels []string
			a := &app{ctx: context.Background(), stdin: strings.NewReader(""), stdout: &out, stderr: &errb,
				onMetrics: func(u string) {
					for series := range scrape(t, u) {
						for _, m := range metricLabel.FindAllStringSubmatch(series, -1) {
							labels = append(labels, m[1])
						}
					}
				}}
			if code := a.execute(append(args, smallRun...)); code != exitOK {
				t.Fatalf("exit %d; stderr:\n%s", code, errb.String())
			}
			places := map[string][]string{
				"the run report":          submatches(reportLine, out.String()),
				"-v's manager line":       submatches(managerLine, errb.String()),
				"-v's allocator table":    firstOnly(submatches(memoryLine, errb.String())),
				"the metrics label":       slices.Compact(slices.Sorted(slices.Values(labels))),
				"the run report (--json)": {jsonAllocator(t, ask)},
			}
			for place, got := range places {
				if len(got) != 1 || got[0] != want {
					t.Errorf("%s names %q; want %q", place, got, want)
				}
			}
			if !slices.Contains(info.Kinds, want) || !slices.ContainsFunc(info.notes, func(l string) bool { return strings.HasPrefix(l, want+" ") }) {
				t.Errorf("vram info lists %q and says %q; want %q among them", info.Kinds, info.notes, want)
			}
		})
	}
}

// infoAllocators is what vram info says of the allocators on smallRun's
// device, read from its text and its JSON, which must agree.
func infoAllocators(t *testing.T) allocatorReport {
	t.Helper()
	spec := smallRun[1]
	stdout, stderr, code := cli(t, "", "info", "--json", "--device", spec)
	if code != exitOK {
		t.Fatalf("info: exit %d; stderr:\n%s", code, stderr)
	}
	var rep infoReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err)
	}
	text, stderr, code := cli(t, "", "info", "--device", spec)
	if code != exitOK {
		t.Fatalf("info: exit %d; stderr:\n%s", code, stderr)
	}
	al := rep.Allocators
	head := fmt.Sprintf("allocators   %s (default %s)\n", strings.Join(al.Kinds, ", "), al.Default)
	if !strings.Contains(text, head) {
		t.Fatalf("info's text lacks %q:\n%s", head, text)
	}
	for _, name := range al.Kinds {
		re := regexp.MustCompile(`(?m)^ {13}(` + regexp.QuoteMeta(name) + ` .*)$`)
		m := re.FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("info's text has no line for %s:\n%s", name, text)
		}
		al.notes = append(al.notes, m[1])
	}
	if !slices.Equal(al.Kinds, alloc.Names()) {
		t.Errorf("info lists %q; want the registry's %q", al.Kinds, alloc.Names())
	}
	return al
}

// jsonAllocator is the allocator vram run --json reports when asked as ask.
func jsonAllocator(t *testing.T, ask allocAsk) string {
	t.Helper()
	args := []string{"run", "--json"}
	if ask.flag != "" {
		args = append(args, "--allocator", ask.flag)
	}
	stdout, stderr, code := cli(t, "", append(args, smallRun...)...)
	if code != exitOK {
		t.Fatalf("run --json: exit %d; stderr:\n%s", code, stderr)
	}
	var r runReport
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	return r.Allocator
}

// submatches is the first group of each match of re in s.
func submatches(re *regexp.Regexp, s string) []string {
	var out []string
	for _, m := range re.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// firstOnly drops the memory reports after the first: the pinned pool's
// follows the device allocator's.
func firstOnly(names []string) []string {
	if len(names) > 1 && names[1] == "pinned" {
		return names[:1]
	}
	return names
}
