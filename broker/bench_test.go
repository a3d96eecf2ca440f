package broker

import (
	"context"
	"slices"
	"testing"
	"time"
)

// reportQuantiles reports the median and 99th percentile of ds in µs.
func reportQuantiles(b *testing.B, prefix string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	q := func(p float64) float64 { return float64(ds[int(p*float64(len(ds)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(q(0.5), prefix+"µs-median")
	b.ReportMetric(q(0.99), prefix+"µs-p99")
}

// BenchmarkAcquireRelease: one lease acquired and released over the
// socket, each a round trip of the client library to the broker.
func BenchmarkAcquireRelease(b *testing.B) {
	_, path := startServer(b, oneDevice(80*GiB))
	c := dial(b, path)
	ctx := context.Background()
	ds := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		l, err := c.Acquire(ctx, LeaseOptions{Name: "bench", Proportion: 0.5})
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	b.StopTimer()
	reportQuantiles(b, "", ds)
}

// BenchmarkClaimToAck: a borrower holds 7 of 8 GiB; the other lease
// claims its guaranteed 4 GiB. Measured: from the claim's call to the
// borrower's acknowledgement returning (ack), and to the claim returning
// granted (claim). The borrower acknowledges as soon as it is told, as a
// batch between chunks would: the figures are the broker's part, to which
// a batch adds at most one chunk's time.
func BenchmarkClaimToAck(b *testing.B) {
	_, path := startServer(b, oneDevice(8*GiB))
	cb, cc := dial(b, path), dial(b, path)
	ctx := context.Background()
	borrower := acquire(b, cb, LeaseOptions{Name: "borrower", Proportion: 0.5})
	claimant := acquire(b, cc, LeaseOptions{Name: "claimant", Proportion: 0.5})
	acked := make(chan time.Time, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			changed := borrower.Changed()
			if sh := borrower.Budget().Shrink; sh != nil {
				if err := borrower.Report(ctx, sh.Bytes); err == nil {
					acked <- time.Now()
				}
			}
			select {
			case <-changed:
			case <-stop:
				return
			}
		}
	}()
	var toAck, toGrant []time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if _, err := claimant.Claim(ctx, 0); err != nil {
			b.Fatal(err)
		}
		if _, err := borrower.Claim(ctx, 7*GiB); err != nil {
			b.Fatal(err)
		}
		if err := borrower.Report(ctx, 7*GiB); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		if got, err := claimant.Claim(ctx, 4*GiB); err != nil || got.Limit != 4*GiB {
			b.Fatalf("claim: %+v, %v", got, err)
		}
		toGrant = append(toGrant, time.Since(start))
		toAck = append(toAck, (<-acked).Sub(start))
	}
	b.StopTimer()
	reportQuantiles(b, "ack-", toAck)
	reportQuantiles(b, "claim-", toGrant)
}
