package trace_test

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/trace"
)

func TestRead(t *testing.T) {
	tests := map[string]struct {
		in   string
		want []trace.Event
	}{
		"RMM header": {
			in: "Thread,Time,Action,Pointer,Size,Stream\n" +
				"0,0.0,allocate,0x2b0d2e000000,20971520,0\n" +
				"0,0.013,free,0x2b0d2e000000,20971520,0\n",
			want: []trace.Event{
				{Time: 0, Action: trace.Allocate, Pointer: 0x2b0d2e000000, Size: 20971520},
				{Time: 0.013, Action: trace.Free, Pointer: 0x2b0d2e000000, Size: 20971520},
			},
		},
		"no header": {
			in:   "7,1.5,allocate,0x1000,512,3\n",
			want: []trace.Event{{Thread: 7, Time: 1.5, Action: trace.Allocate, Pointer: 0x1000, Size: 512, Stream: 3}},
		},
		"columns reordered, extra column, case": {
			in:   "size,POINTER,action,extra\n512,0x10,Allocate,x\n512,0x10,FREE,y\n",
			want: []trace.Event{{Action: trace.Allocate, Pointer: 0x10, Size: 512}, {Action: trace.Free, Pointer: 0x10, Size: 512}},
		},
		"decimal and bare hex pointers, hex stream": {
			in: "Thread,Time,Action,Pointer,Size,Stream\n" +
				"1,0,allocate,4096,10,0x7f\n" +
				"1,0,allocate,7fab00,10,12\n",
			want: []trace.Event{
				{Thread: 1, Action: trace.Allocate, Pointer: 4096, Size: 10, Stream: 0x7f},
				{Thread: 1, Action: trace.Allocate, Pointer: 0x7fab00, Size: 10, Stream: 12},
			},
		},
		"allocate failure, short line without stream": {
			in:   "Thread,Time,Action,Pointer,Size,Stream\n2,8e-06,allocate failure,0x0,1099511627776\n",
			want: []trace.Event{{Thread: 2, Time: 8e-06, Action: trace.AllocateFailure, Size: 1 << 40}},
		},
		"CRLF, BOM, blank lines, comments, quotes, spaces": {
			in: "\uFEFFThread,Time,Action,Pointer,Size,Stream\r\n\r\n# recorded by hand\r\n" +
				" 3 , 0.5 , \"allocate\" , \"0xABC00\" , 64 , 0 \r\n",
			want: []trace.Event{{Thread: 3, Time: 0.5, Action: trace.Allocate, Pointer: 0xabc00, Size: 64}},
		},
		"clock time, as RMM's logger writes": {
			in:   "Thread,Time,Action,Pointer,Size,Stream\n140230,13:04:05.250000,allocate,0x100,1,0\n",
			want: []trace.Event{{Thread: 140230, Time: 13*3600 + 4*60 + 5.25, Action: trace.Allocate, Pointer: 0x100, Size: 1}},
		},
		"text thread id": {
			in: "Thread,Time,Action,Pointer,Size,Stream\nworker-1,0,allocate,0x100,1,0\nworker-1,0,free,0x100,1,0\n",
		},
		"empty":       {in: ""},
		"header only": {in: "Thread,Time,Action,Pointer,Size,Stream\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := trace.Read(strings.NewReader(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if name == "text thread id" {
				if len(got) != 2 || got[0].Thread == 0 || got[0].Thread != got[1].Thread {
					t.Errorf("text thread ids not kept apart consistently: %+v", got)
				}
				return
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Read =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestReadMalformed(t *testing.T) {
	const h = "Thread,Time,Action,Pointer,Size,Stream\n"
	tests := map[string]struct {
		in   string
		want string // in the error, with the line number
	}{
		"bad action":         {h + "0,0,allocate,0x10,1,0\n0,0,resize,0x10,1,0\n", "line 3"},
		"bad size":           {h + "0,0,allocate,0x10,ten,0\n", `size "ten"`},
		"negative size":      {h + "0,0,allocate,0x10,-1,0\n", `size "-1"`},
		"bad pointer":        {h + "0,0,allocate,0xZZ,1,0\n", `pointer "0xZZ"`},
		"bad time":           {h + "0,yesterday,allocate,0x10,1,0\n", `time "yesterday"`},
		"negative time":      {h + "0,-1,allocate,0x10,1,0\n", `time "-1"`},
		"bad stream":         {h + "0,0,allocate,0x10,1,s1\n", `stream "s1"`},
		"too few fields":     {h + "0,0,allocate\n", "line 2"},
		"header lacks":       {"Thread,Time,Action,Size\n", "Pointer"},
		"header twice":       {"Action,Pointer,Size,size\n", "twice"},
		"no header, junk":    {"hello world\n", "line 1"},
		"size 2^63":          {h + "0,0,allocate,0x10,9223372036854775808,0\n", "no device holds"},
		"size 2^64-1":        {h + "0,0,free,0x10,18446744073709551615,0\n", "trace.MaxSize"},
		"long line cut":      {h + "0,0,resize," + strings.Repeat("x", 500000) + ",1,0\n", "(500015 bytes)"},
		"line over 1 MiB":    {h + "0,0,allocate,0x10,1,0\n\n0,0,allocate,0x20," + strings.Repeat("1", 1<<20) + ",0\n", "line 4 is longer than a line may be (1 MiB)"},
		"comment over 1 MiB": {h + "# " + strings.Repeat("c", 1<<20) + "\n", "line 2 is longer"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := trace.Read(strings.NewReader(tc.in))
			if !errors.Is(err, trace.ErrMalformed) {
				t.Fatalf("err = %v, want trace.ErrMalformed", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			if len(err.Error()) > 600 {
				t.Errorf("error of %d bytes: want the line cut to a short prefix", len(err.Error()))
			}
		})
	}
}

// Sizes that would wrap a sum of 64 bits: Summarize and DeviceBytes count
// without wrapping, and a log that needs more than any device is refused
// by the simulator instead of replaying on a small device.
func TestHugeSizesDoNotWrap(t *testing.T) {
	half := uint64(1) << 63
	tests := map[string]struct {
		events []trace.Event
		peak   uint64
	}{
		"two of 2^63": {[]trace.Event{
			{Action: trace.Allocate, Pointer: 1, Size: half},
			{Action: trace.Allocate, Pointer: 2, Size: half},
		}, math.MaxUint64},
		"2^64-1": {[]trace.Event{{Action: trace.Allocate, Pointer: 1, Size: math.MaxUint64}}, math.MaxUint64},
		"back under after a free": {[]trace.Event{
			{Action: trace.Allocate, Pointer: 1, Size: half},
			{Action: trace.Allocate, Pointer: 2, Size: half},
			{Action: trace.Free, Pointer: 1},
			{Action: trace.Free, Pointer: 2},
			{Action: trace.Allocate, Pointer: 3, Size: 5},
		}, math.MaxUint64},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := trace.Summarize(tc.events)
			if s.PeakLive != tc.peak {
				t.Errorf("PeakLive = %d, want %d", s.PeakLive, tc.peak)
			}
			cfg := simConfig(tc.events)
			if cfg.TotalBytes != math.MaxUint64 {
				t.Errorf("DeviceBytes = %d, want the saturated %d", cfg.TotalBytes, uint64(math.MaxUint64))
			}
			_, err := trace.ReplayOn(tc.events, simFor(tc.events), func(dev device.Device) (alloc.Allocator, error) {
				return alloc.NewDirect(dev), nil
			}, trace.Options{})
			if !errors.Is(err, device.ErrInvalidValue) {
				t.Errorf("replay of a log needing more than 2^64 bytes: %v, want refused (ErrInvalidValue)", err)
			}
		})
	}
	s := trace.Summarize(tests["back under after a free"].events)
	if s.LiveAtEnd != 5 || s.BlocksAtEnd != 1 {
		t.Errorf("LiveAtEnd = %d in %d blocks, want 5 in 1", s.LiveAtEnd, s.BlocksAtEnd)
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	events := []trace.Event{
		{Thread: 1, Time: 0, Action: trace.Allocate, Pointer: 0x7f0000000000, Size: 1 << 30, Stream: 0},
		{Thread: 2, Time: 8e-06, Action: trace.AllocateFailure, Pointer: 0, Size: 1 << 50, Stream: 5},
		{Thread: 1, Time: 1.2345678901234, Action: trace.Free, Pointer: 0x7f0000000000, Size: 1 << 30, Stream: 140737},
	}
	var buf bytes.Buffer
	if err := trace.Write(&buf, events); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(buf.String(), trace.Header+"\n") {
		t.Errorf("output does not start with the header:\n%s", buf.String())
	}
	got, err := trace.Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, events) {
		t.Errorf("round trip =\n%+v\nwant\n%+v", got, events)
	}
}

func TestSummarize(t *testing.T) {
	events := []trace.Event{
		{Action: trace.Allocate, Pointer: 1, Size: 100},
		{Action: trace.Allocate, Pointer: 2, Size: 50, Stream: 1},
		{Action: trace.Free, Pointer: 1, Size: 100},
		{Action: trace.Free, Pointer: 9, Size: 7}, // never allocated
		{Action: trace.AllocateFailure, Size: 1 << 40},
		{Action: trace.Allocate, Pointer: 3, Size: 200},
		{Action: trace.Allocate, Pointer: 3, Size: 10, Time: 2}, // 3 again, without a free
	}
	got := trace.Summarize(events)
	want := trace.Summary{
		Events: 7, Allocs: 4, Frees: 1, Failures: 1, UnmatchedFrees: 1, Reallocs: 1, Streams: 2,
		PeakLive: 250, PeakBlocks: 2, LiveAtEnd: 60, BlocksAtEnd: 2, Duration: 2,
	}
	if got != want {
		t.Errorf("Summarize =\n%+v\nwant\n%+v", got, want)
	}
	if trace.PeakLive(events) != 250 {
		t.Errorf("PeakLive = %d", trace.PeakLive(events))
	}
}

// FuzzRead: Read never panics, and what it reads it writes back and reads
// the same.
func FuzzRead(f *testing.F) {
	f.Add("Thread,Time,Action,Pointer,Size,Stream\n0,0.0,allocate,0x2b0d2e000000,20971520,0\n")
	f.Add("size,pointer,action\n1,2,free\n")
	f.Add("7,1.5,allocate failure,0x0,512,3\r\n# c\n")
	f.Add("1,13:04:05.25,allocate,ff,1,0x7f\n")
	f.Fuzz(func(t *testing.T, in string) {
		events, err := trace.Read(strings.NewReader(in))
		if err != nil {
			if !errors.Is(err, trace.ErrMalformed) {
				t.Fatalf("error not wrapping ErrMalformed: %v", err)
			}
			return
		}
		var buf bytes.Buffer
		if err := trace.Write(&buf, events); err != nil {
			t.Fatal(err)
		}
		again, err := trace.Read(&buf)
		if err != nil {
			t.Fatalf("reading back what Write wrote: %v\n%s", err, buf.String())
		}
		if len(events) == 0 && len(again) == 0 {
			return
		}
		if !reflect.DeepEqual(again, events) {
			t.Fatalf("round trip changed the events:\n%+v\n%+v", events, again)
		}
	})
}
