package shard

import (
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
)

// checkTiling checks the rule's promises for R runs in N shards: shard 0
// starts at 0, each shard starts where the one before ended, the last
// ends at R, lengths differ by at most one, each range matches the exact
// big-integer ⌊i·R/N⌋, and Owner puts the runs at each shard's edges in
// that shard.
func checkTiling(t *testing.T, runs, n uint64, shards []uint64) {
	t.Helper()
	floor := runs / n
	for _, i := range shards {
		s := Shard{Index: i, Count: n}
		start, end := s.Range(runs)
		want := new(big.Int).Div(new(big.Int).Mul(new(big.Int).SetUint64(i), new(big.Int).SetUint64(runs)), new(big.Int).SetUint64(n))
		if !want.IsUint64() || want.Uint64() != start {
			t.Fatalf("R=%d N=%d shard %d starts at %d, want ⌊i·R/N⌋ = %s", runs, n, i, start, want)
		}
		if i == 0 && start != 0 {
			t.Fatalf("R=%d N=%d: shard 0 starts at %d", runs, n, start)
		}
		if i == n-1 && end != runs {
			t.Fatalf("R=%d N=%d: the last shard ends at %d", runs, n, end)
		}
		if i+1 < n {
			if next, _ := (Shard{Index: i + 1, Count: n}).Range(runs); next != end {
				t.Fatalf("R=%d N=%d: shard %d ends at %d, shard %d starts at %d", runs, n, i, end, i+1, next)
			}
		}
		if l := end - start; l != floor && l != floor+1 {
			t.Fatalf("R=%d N=%d: shard %d holds %d runs, want %d or %d", runs, n, i, l, floor, floor+1)
		}
		for _, r := range []uint64{start, end - 1} {
			if start == end {
				break
			}
			if o := Owner(r, runs, n); o != i {
				t.Fatalf("R=%d N=%d: run %d is in shard %d but Owner says %d", runs, n, r, i, o)
			}
		}
	}
}

// TestEveryRunInExactlyOneShard enumerates small batches whole: each run
// is counted in exactly one shard, and Owner names it.
func TestEveryRunInExactlyOneShard(t *testing.T) {
	for runs := uint64(0); runs <= 40; runs++ {
		for n := uint64(1); n <= 45; n++ {
			seen := make([]int, runs)
			for i := range n {
				start, end := Shard{Index: i, Count: n}.Range(runs)
				if start > end || end > runs {
					t.Fatalf("R=%d N=%d: shard %d is [%d, %d)", runs, n, i, start, end)
				}
				for r := start; r < end; r++ {
					seen[r]++
					if o := Owner(r, runs, n); o != i {
						t.Fatalf("R=%d N=%d: run %d in shard %d, Owner %d", runs, n, r, i, o)
					}
				}
			}
			for r, c := range seen {
				if c != 1 {
					t.Fatalf("R=%d N=%d: run %d is in %d shards, want exactly 1", runs, n, r, c)
				}
			}
		}
	}
}

// TestRuleProperty draws R and N over the whole uint64 range, huge ones
// included, where i·R overflows 64 bits.
func TestRuleProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 1))
	edges := []uint64{1, 2, 3, 7, 1 << 32, math.MaxUint32 + 1, 1<<63 - 1, 1 << 63, math.MaxUint64 - 1, math.MaxUint64}
	draw := func() uint64 {
		switch rng.IntN(3) {
		case 0:
			return edges[rng.IntN(len(edges))]
		case 1:
			return rng.Uint64N(1000) + 1
		default:
			return rng.Uint64() | 1
		}
	}
	for range 3000 {
		runs, n := draw(), draw()
		// Every shard for small N; the ends and random ones for large N.
		var shards []uint64
		if n <= 64 {
			for i := range n {
				shards = append(shards, i)
			}
		} else {
			shards = []uint64{0, 1, n / 2, n - 2, n - 1, rng.Uint64N(n)}
		}
		checkTiling(t, runs, n, shards)
		// A random run lies in the range of the shard Owner names.
		if runs > 0 {
			r := rng.Uint64N(runs)
			o := Owner(r, runs, n)
			if start, end := (Shard{Index: o, Count: n}).Range(runs); r < start || r >= end {
				t.Fatalf("R=%d N=%d: Owner(%d) = %d, whose runs are [%d, %d)", runs, n, r, o, start, end)
			}
		}
	}
}

// FuzzRule is the property as a fuzz target (go test -fuzz FuzzRule).
func FuzzRule(f *testing.F) {
	f.Add(uint64(10), uint64(3), uint64(4))
	f.Add(uint64(math.MaxUint64), uint64(math.MaxUint64-1), uint64(12345))
	f.Fuzz(func(t *testing.T, runs, n, r uint64) {
		if n == 0 {
			return
		}
		shards := []uint64{0, n - 1}
		if runs > 0 {
			r %= runs
			o := Owner(r, runs, n)
			shards = append(shards, o)
			if start, end := (Shard{Index: o, Count: n}).Range(runs); r < start || r >= end {
				t.Fatalf("Owner(%d) = %d, runs [%d, %d)", r, o, start, end)
			}
		}
		checkTiling(t, runs, n, shards)
	})
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Shard
		wantErr string
	}{
		{in: "0/4", want: Shard{0, 4, "--shard"}},
		{in: " 3/4 ", want: Shard{3, 4, "--shard"}},
		{in: "0/1", want: Shard{0, 1, "--shard"}},
		{in: "4/4", wantErr: "want 0 to 3"},
		{in: "0/0", wantErr: "at least 1"},
		{in: "1", wantErr: "want i/N"},
		{in: "-1/4", wantErr: "whole numbers"},
		{in: "a/b", wantErr: "whole numbers"},
	} {
		got, err := Parse(tc.in)
		if tc.wantErr != "" {
			if err == nil || !errors.Is(err, ErrShard) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Parse(%q) = %v, %v; want an ErrShard saying %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    Shard
		ok      bool
		wantErr string
	}{
		{name: "none", env: map[string]string{}, ok: false},
		{name: "slurm 0-3", env: map[string]string{EnvSlurmID: "2", EnvSlurmMin: "0", EnvSlurmCount: "4"}, want: Shard{2, 4, "slurm"}, ok: true},
		{name: "slurm 1-8", env: map[string]string{EnvSlurmID: "8", EnvSlurmMin: "1", EnvSlurmCount: "8"}, want: Shard{7, 8, "slurm"}, ok: true},
		{name: "slurm step", env: map[string]string{EnvSlurmID: "14", EnvSlurmMin: "0", EnvSlurmStep: "2", EnvSlurmCount: "8"}, want: Shard{7, 8, "slurm"}, ok: true},
		{name: "slurm no min", env: map[string]string{EnvSlurmID: "1", EnvSlurmCount: "2"}, want: Shard{1, 2, "slurm"}, ok: true},
		{name: "slurm no count", env: map[string]string{EnvSlurmID: "1"}, ok: true, wantErr: EnvSlurmCount},
		{name: "slurm holes", env: map[string]string{EnvSlurmID: "9", EnvSlurmMin: "1", EnvSlurmCount: "3"}, ok: true, wantErr: "holes"},
		{name: "slurm off step", env: map[string]string{EnvSlurmID: "3", EnvSlurmMin: "0", EnvSlurmStep: "2", EnvSlurmCount: "4"}, ok: true, wantErr: "step 2"},
		{name: "slurm bad", env: map[string]string{EnvSlurmID: "x", EnvSlurmCount: "2"}, ok: true, wantErr: "whole number"},
		{name: "slurm wins", env: map[string]string{EnvSlurmID: "0", EnvSlurmCount: "2", EnvK8sIndex: "1", EnvCount: "2"}, want: Shard{0, 2, "slurm"}, ok: true},
		{name: "kubernetes", env: map[string]string{EnvK8sIndex: "3", EnvCount: "4"}, want: Shard{3, 4, "kubernetes"}, ok: true},
		{name: "kubernetes no count", env: map[string]string{EnvK8sIndex: "3"}, ok: true, wantErr: EnvCount},
		{name: "kubernetes past count", env: map[string]string{EnvK8sIndex: "4", EnvCount: "4"}, ok: true, wantErr: "spec.completions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := FromEnv(func(k string) string { return tc.env[k] })
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, ErrShard) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want an ErrShard naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}
