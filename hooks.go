package vram

// Hook delivery, in the order the events happened.
//
// Each client has a queue of hook calls. An event (an allocation
// installed, arrays invalidated) appends its call to the queue of each
// client it concerns under Manager.mu, in the same critical section that
// makes the event happen, so the queues are in event order. A call may
// be appended before it can be made (an allocation's response is
// finished after its arrays are installed): it is then not ready, and
// the calls behind it wait. After releasing every lock, the goroutine
// that caused an event delivers the client's ready calls from the head
// of the queue; if another goroutine is delivering that client's calls
// already (or a call is not ready yet), it leaves them to it, and that
// goroutine delivers them after its own, in order. So a client's hooks
// run one at a time, in event order: an OnAllocated is never overtaken
// by the OnInvalidate of an invalidation that came after it.

// hookCall is one queued hook call.
type hookCall struct {
	fn    func()
	ready bool // protected by the client's hookMu
}

// postLocked appends fn to c's hook queue; ready says whether it may be
// called at once (else markReady makes it so). m.mu must be held.
func (c *Client) postLocked(fn func(), ready bool) *hookCall {
	h := &hookCall{fn: fn, ready: ready}
	c.hookMu.Lock()
	c.hooks = append(c.hooks, h)
	c.hookMu.Unlock()
	return h
}

// markReady lets h be called.
func (c *Client) markReady(h *hookCall) {
	c.hookMu.Lock()
	h.ready = true
	c.hookMu.Unlock()
}

// deliverHooks calls c's ready hooks from the head of its queue, unless
// another goroutine is doing so; call it with no lock held.
func (c *Client) deliverHooks() {
	c.hookMu.Lock()
	if c.delivering {
		c.hookMu.Unlock()
		return
	}
	c.delivering = true
	for len(c.hooks) > 0 && c.hooks[0].ready {
		h := c.hooks[0]
		c.hooks[0] = nil
		c.hooks = c.hooks[1:]
		c.hookMu.Unlock()
		c.runHook(h.fn)
		c.hookMu.Lock()
	}
	c.delivering = false
	if len(c.hooks) == 0 {
		c.hooks = nil // let the backing array go
	}
	c.hookMu.Unlock()
}

// runHook calls fn; if it panics, the next event's goroutine takes over
// delivering c's hooks.
func (c *Client) runHook(fn func()) {
	done := false
	defer func() {
		if !done {
			c.hookMu.Lock()
			c.delivering = false
			c.hookMu.Unlock()
		}
	}()
	fn()
	done = true
}

// deliver delivers the ready hooks of each client in cs, in order.
func deliver(cs []*Client) {
	for _, c := range cs {
		c.deliverHooks()
	}
}

// postInvalidateLocked queues the OnInvalidate hook of every open client
// that has one, with reason, and returns them and their calls (ready or
// not as said). m.mu must be held.
func (m *Manager) postInvalidateLocked(reason error, ready bool) ([]*Client, []*hookCall) {
	var cs []*Client
	var calls []*hookCall
	for _, c := range m.reg.all() {
		if h := c.invalidateLocked(reason, ready); h != nil {
			cs = append(cs, c)
			calls = append(calls, h)
		}
	}
	return cs, calls
}

// invalidateLocked queues c's OnInvalidate hook with reason; nil when c
// has none. m.mu must be held.
func (c *Client) invalidateLocked(reason error, ready bool) *hookCall {
	if c.onInvalidate == nil {
		return nil
	}
	on := c.onInvalidate
	return c.postLocked(func() { on(reason) }, ready)
}
