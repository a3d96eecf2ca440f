package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryErrorSaysVramOnce runs every error path of the command it can
// reach without a GPU or a broker (bad flags, bad device specs, bad
// files, refused plans, a bad $VRAM_ALLOC_CONF, merges and replays that
// fail, the broker's and lease's usage errors, a batch that fails on the
// device) and refuses a message that says "vram:" other than once, at its
// start: the command adds its name in one place (app.go), and no error it
// prints, the library's included, says it again.
func TestEveryErrorSaysVramOnce(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("bad.json", "not json")
	write("neg.json", `{"requests": {"out": {"x": {"shape": [100, -5], "dtype": "float64", "chunk_axis": 1}}}}`)
	write("unch.json", `{"requests": {"out": {"x": {"shape": [100, 100], "dtype": "float64", "chunk_axis": 1, "unchunkable": true}}}}`)
	write("mismatch.json", `{"requests": {"a": {"x": {"shape": [10, 100], "dtype": "float32", "chunk_axis": 1}}, "b": {"y": {"shape": [10, 200], "dtype": "float32", "chunk_axis": 1}}}}`)
	write("bad.csv", "a,b\n1,2\n")
	write("empty.csv", "Thread,Time,Action,Pointer,Size,Stream\n")
	write("bad.pickle", "\x80\x02garbage")
	write("notnpy.npy", "x")
	trace, err := os.ReadFile(filepath.Join("testdata", "minimalloc_A.csv"))
	if err != nil {
		t.Fatal(err)
	}
	write("ok.csv", string(trace))
	small := []string{"run", "--runs", "100", "--steps", "2", "--samples", "3"}
	run := func(args ...string) []string { return append(append([]string(nil), small...), args...) }
	// Parts for the merges: two shards of different batches, a lone
	// shard, and a shard whose manifest is not JSON.
	for _, args := range [][]string{
		run("--shard", "0/2", "--out", filepath.Join(dir, "mixed.npy")),
		run("--shard", "1/2", "--seed", "2", "--out", filepath.Join(dir, "mixed.npy")),
		run("--shard", "0/2", "--out", filepath.Join(dir, "lone.npy")),
		run("--shard", "0/2", "--out", filepath.Join(dir, "garbled.npy")),
	} {
		if _, stderr, code := cli(t, "", args...); code != exitOK {
			t.Fatalf("vram %s: exit %d\n%s", strings.Join(args, " "), code, stderr)
		}
	}
	write("garbled.shard-0-of-2.json", "{")

	d := func(name string) string { return filepath.Join(dir, name) }
	tests := map[string]struct {
		args  []string
		env   map[string]string
		stdin string
	}{
		"no command":          {args: nil},
		"unknown command":     {args: []string{"inof"}},
		"unknown flag":        {args: []string{"info", "--colour"}},
		"extra argument":      {args: []string{"info", "extra"}},
		"bad int flag":        {args: []string{"plan", "--buffers", "two"}},
		"bad duration":        {args: []string{"bench", "--time", "5"}},
		"bad bool":            {args: []string{"run", "--double-buffer=maybe"}},
		"negative runs":       {args: []string{"run", "--runs", "-5"}},
		"bad dt":              {args: run("--dt", "5")},
		"bad samples":         {args: []string{"run", "--samples", "7", "--steps", "40"}},
		"run: vram too small": {args: run("--vram", "1KiB")},
		"run: bad host-mem":   {args: run("--host-mem", "lots")},
		"run: bad shard":      {args: run("--shard", "3/2")},
		"run: bad metrics":    {args: run("--metrics-addr", "bad::addr")},
		"run: bad allocator":  {args: run("--allocator", "foo")},
		"run: bad out name":   {args: run("--out", d("ok.csv"))},
		"run: out dir gone":   {args: run("--out", d("none/out.npy"))},
		"run: devices small":  {args: run("--devices", "sim:count=2", "--vram", "1KiB")},
		"run: no cuda":        {args: run("--device", "cuda")},
		"run: no cuda device": {args: run("--devices", "cuda:7")},
		"empty device":        {args: []string{"info", "--device", " "}},
		"unknown backend":     {args: []string{"info", "--device", "tpu:0"}},
		"unknown sim option":  {args: []string{"info", "--device", "sim:bogus=1"}},
		"bad sim size":        {args: run("--device", "sim:vram=lots")},
		"zero sim size":       {args: []string{"bench", "--device", "sim:vram=0"}},
		"bad VRAM_DEVICE":     {args: []string{"info"}, env: map[string]string{"VRAM_DEVICE": "tpu:0"}},
		"plan: bad json":      {args: []string{"plan", d("bad.json")}},
		"plan: bad shape":     {args: []string{"plan", d("neg.json")}},
		"plan: bad stdin":     {args: []string{"plan"}, stdin: `{"requests": {}}`},
		"plan: no file":       {args: []string{"plan", d("none.json")}},
		"plan: two files":     {args: []string{"plan", "a.json", "b.json"}},
		"plan: refused":       {args: []string{"plan", "--budget", "1KiB", d("unch.json")}},
		"plan: runs disagree": {args: []string{"plan", d("mismatch.json")}},
		"plan: bad budget":    {args: []string{"plan", "--budget", "lots"}},
		"plan: tiny device":   {args: []string{"plan", "--device", "sim:vram=1KiB", d("unch.json")}},
		"run: refused plan": {args: []string{"run", "--device", "sim:granularity=64KiB,context=0", "--runs", "20000",
			"--steps", "10000", "--samples", "10001", "--dt", "0.001", "--vram", "64KiB"}},
		"run: refused, direct": {args: run("--vram", "3MiB", "--allocator", "direct", "--runs", "2000", "--samples", "11", "--steps", "10")},
		"run: staging refused": {args: run("--host-mem", "16B", "--out", d("staged.npy"), "--runs", "2000")}, // below one run's staging
		"run: batch fails":     {args: []string{"run", "--device", "sim:granularity=64GiB,vram=256GiB", "--runs", "10", "--steps", "1"}},
		"alloc conf kind":      {args: run(), env: map[string]string{"VRAM_ALLOC_CONF": "kind:nope"}},
		"alloc conf key":       {args: run(), env: map[string]string{"VRAM_ALLOC_CONF": "bogus:1"}},
		"alloc conf limit":     {args: run(), env: map[string]string{"VRAM_ALLOC_CONF": "limit:lots"}},
		"alloc conf no value":  {args: run(), env: map[string]string{"VRAM_ALLOC_CONF": "kind"}},
		"replay: no file":      {args: []string{"replay"}},
		"replay: bad csv":      {args: []string{"replay", d("bad.csv")}},
		"replay: empty":        {args: []string{"replay", d("empty.csv")}},
		"replay: bad pickle":   {args: []string{"replay", d("bad.pickle")}},
		"replay: missing":      {args: []string{"replay", d("none.csv")}},
		"replay: small vram":   {args: []string{"replay", "--vram", "1KiB", d("ok.csv")}},
		"replay: allocator":    {args: []string{"replay", "--allocator", "nope", d("ok.csv")}},
		"replay: plot name":    {args: []string{"replay", "--plot", d("plot.txt"), d("ok.csv")}},
		"replay: plot two":     {args: []string{"replay", "--plot", d("plot.svg"), d("ok.csv"), d("ok.csv")}},
		"replay: out is input": {args: []string{"replay", "--snapshot-out", d("ok.csv"), d("ok.csv")}},
		"bench: allocator":     {args: []string{"bench", "--allocator", "nope"}},
		"merge: no parts":      {args: []string{"merge", d("nothing.npy")}},
		"merge: no manifest":   {args: []string{"merge", d("out.npy"), d("notnpy.npy")}},
		"merge: bad name":      {args: []string{"merge", d("ok.csv")}},
		"merge: two batches":   {args: []string{"merge", d("mixed.npy")}},
		"merge: runs missing":  {args: []string{"merge", d("lone.npy")}},
		"merge: bad manifest":  {args: []string{"merge", d("garbled.npy")}},
		"lease: no share":      {args: []string{"lease", "--", "true"}},
		"lease: two shares":    {args: []string{"lease", "--bytes", "1GiB", "--proportion", "0.5", "--", "true"}},
		"lease: no command":    {args: []string{"lease", "--bytes", "1GiB"}},
		"lease: no broker":     {args: []string{"lease", "--bytes", "1GiB", "--socket", d("none.sock"), "--", "true"}},
		"broker: socket mode":  {args: []string{"broker", "--socket-mode", "0777"}},
		"broker: bad group":    {args: []string{"broker", "--socket-group", "nosuchgroup", "--socket-mode", "0660", "--socket", d("b.sock")}},
		"broker: bad devices":  {args: []string{"broker", "--devices", "sim:vram=lots"}},
		"broker: no broker":    {args: []string{"broker", "status", "--socket", d("none.sock")}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, stderr, code := cli(t, tc.stdin, tc.args...)
			if code == exitOK {
				t.Fatalf("vram %s: exit 0, want an error; stderr:\n%s", strings.Join(tc.args, " "), stderr)
			}
			msg := errorText(stderr)
			if !strings.HasPrefix(msg, "vram: ") || strings.Count(msg, "vram:") != 1 {
				t.Errorf("vram %s: the error should say \"vram:\" once, at its start:\n%s", strings.Join(tc.args, " "), msg)
			}
		})
	}
}

// errorText is stderr less what the command prints besides its error:
// progress ("vram run[PID]: …"), logs (slog's "time=… level=…") and the
// pointer to --help.
func errorText(stderr string) string {
	var keep []string
	for _, l := range strings.Split(strings.TrimRight(stderr, "\n"), "\n") {
		switch {
		case strings.HasPrefix(l, jobTag()+": "), strings.HasPrefix(l, "time="), strings.HasPrefix(l, "level="),
			strings.HasPrefix(l, "Run '") && strings.HasSuffix(l, "--help' for usage."):
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}
