package broker

import (
	"context"
	"testing"
	"time"
)

// The context given to Dial bounds Dial alone: cancelled once Dial
// returns, it leaves the client's connection (and so its session's
// readiness) be. (It once tore the watch down, and a client's calls then
// waited for a new greeting.)
func TestDialContextBoundsDialAlone(t *testing.T) {
	_, path := startServer(t, oneDevice(GiB))
	ctx, cancel := context.WithCancel(context.Background())
	c, err := Dial(ctx, path, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.mu.Lock()
	down := c.conn.done
	c.mu.Unlock()
	cancel()
	if _, err := c.Status(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	lost := waitFor(time.Second, func() bool {
		select {
		case <-down:
			return true
		default:
			return false
		}
	})
	if lost {
		t.Error("cancelling Dial's context broke the client's connection")
	}
}
