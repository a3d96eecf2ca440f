package devicetest

// Streams and events: ordering, asynchrony, waits across streams, sticky
// errors, device-wide synchronization.

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/vramkit/vram/device"
)

func testStreamOrder(t *testing.T, o opener) {
	d := o.fresh(t)
	backed(t, d)
	s := strm(t)(d.NewStream())
	defer func() { ok(t, s.Close()) }()
	const n = 4096
	p := ptr(t)(d.Malloc(n))
	defer func() { ok(t, d.Free(p)) }()
	// Many writes to one place, then reads after each: every read must see
	// the write just before it and nothing later.
	const rounds = 64
	reads := make([][]byte, rounds)
	for i := range rounds {
		ok(t, d.CopyHtoD(p, pattern(n, byte(i)), s))
		ok(t, d.Memset(p.Add(uint64(i)), 0xff, 1, s))
		reads[i] = make([]byte, n)
		ok(t, d.CopyDtoH(reads[i], p, s))
	}
	syncStream(t, s)
	for i := range rounds {
		want := pattern(n, byte(i))
		want[i] = 0xff
		if !bytes.Equal(reads[i], want) {
			t.Fatalf("read %d saw other writes than the ones enqueued before it", i)
		}
	}
	if done, err := s.Query(); err != nil || !done {
		t.Errorf("Query after Synchronize = %v, %v; want true, nil", done, err)
	}
}

func testAsynchrony(t *testing.T, o opener) {
	d := o.fresh(t)
	backed(t, d)
	s := strm(t)(d.NewStream())
	defer func() { ok(t, s.Close()) }()
	p := ptr(t)(d.Malloc(64))
	defer func() { ok(t, d.Free(p)) }()
	ok(t, d.CopyHtoD(p, []byte("written on the device"), s))
	syncStream(t, s)

	got := hostBytes(t, d, 21)
	release := hold(t, d, s)
	ok(t, d.CopyDtoH(got, p, s))
	if string(got) != string(make([]byte, 21)) {
		t.Fatalf("CopyDtoH wrote %q before its stream reached it", got)
	}
	if done, err := s.Query(); err != nil || done {
		t.Fatalf("Query on a held stream = %v, %v; want false, nil", done, err)
	}
	release()
	syncStream(t, s)
	if string(got) != "written on the device" {
		t.Fatalf("after Synchronize got %q", got)
	}
	if done, err := s.Query(); err != nil || !done {
		t.Fatalf("Query after Synchronize = %v, %v; want true, nil", done, err)
	}
}

func testEvents(t *testing.T, o opener) {
	t.Run("never recorded", func(t *testing.T) { eventNeverRecorded(t, o) })
	t.Run("record and query", func(t *testing.T) { eventRecordAndQuery(t, o) })
	t.Run("cross-stream wait", func(t *testing.T) { eventCrossStreamWait(t, o) })
	t.Run("wait ignores work after the record", func(t *testing.T) { eventWaitIgnoresLaterWork(t, o) })
	t.Run("re-record moves the mark", func(t *testing.T) { eventReRecord(t, o) })
	t.Run("record captures only earlier work", func(t *testing.T) { eventRecordCapturesEarlierWork(t, o) })
}

// eventNeverRecorded: an event never recorded is complete.
func eventNeverRecorded(t *testing.T, o opener) {
	d := o.fresh(t)
	e := evt(t)(d.NewEvent())
	defer func() { ok(t, e.Close()) }()
	if done, err := e.Query(); err != nil || !done {
		t.Errorf("Query of a fresh event = %v, %v; want true, nil", done, err)
	}
	within(t, "Event.Synchronize", func() { ok(t, e.Synchronize()) })
	ok(t, e.Wait(d.DefaultStream()))
	syncStream(t, d.DefaultStream())
}

// eventRecordAndQuery: an event recorded behind held work is pending
// until the work is done.
func eventRecordAndQuery(t *testing.T, o opener) {
	d := o.fresh(t)
	s, e := streamAndEvent(t, d)
	release := hold(t, d, s)
	ok(t, e.Record(s))
	if done, err := e.Query(); err != nil || done {
		t.Fatalf("Query of an event behind held work = %v, %v; want false, nil", done, err)
	}
	release()
	within(t, "Event.Synchronize", func() { ok(t, e.Synchronize()) })
	if done, err := e.Query(); err != nil || !done {
		t.Fatalf("Query after Synchronize = %v, %v; want true, nil", done, err)
	}
}

// streamAndEvent makes a stream and an event on d, closed when the test
// ends.
func streamAndEvent(t *testing.T, d device.Device) (device.Stream, device.Event) {
	s := strm(t)(d.NewStream())
	t.Cleanup(func() { ok(t, s.Close()) })
	e := evt(t)(d.NewEvent())
	t.Cleanup(func() { ok(t, e.Close()) })
	return s, e
}

// crossStreams is a fresh backed device with two streams, an event and
// an allocation, for the tests of waits across streams; all are given
// back when the test ends.
type crossStreams struct {
	d      device.Device
	s1, s2 device.Stream
	e      device.Event
	p      device.Ptr
}

// newCrossStreams makes them, the allocation of n bytes.
func newCrossStreams(t *testing.T, o opener, n uint64) crossStreams {
	d := o.fresh(t)
	backed(t, d)
	x := crossStreams{d: d, s1: strm(t)(d.NewStream()), s2: strm(t)(d.NewStream())}
	t.Cleanup(func() { ok(t, x.s1.Close()); ok(t, x.s2.Close()) })
	x.e = evt(t)(d.NewEvent())
	t.Cleanup(func() { ok(t, x.e.Close()) })
	x.p = ptr(t)(d.Malloc(n))
	t.Cleanup(func() { ok(t, d.Free(x.p)) })
	return x
}

// eventCrossStreamWait: a stream that waits on an event runs its work
// only after the event's, without blocking the host.
func eventCrossStreamWait(t *testing.T, o opener) {
	x := newCrossStreams(t, o, 256)
	d, s1, s2, e, p := x.d, x.s1, x.s2, x.e, x.p
	src := hostText(t, d, "from stream one")
	got := hostBytes(t, d, 15)
	release := hold(t, d, s1)
	ok(t, d.CopyHtoD(p, src, s1))
	ok(t, e.Record(s1))
	within(t, "Event.Wait on a held stream's event (it must not block the host)", func() { ok(t, e.Wait(s2)) })
	ok(t, d.CopyDtoH(got, p, s2))
	if done, err := s2.Query(); err != nil || done {
		t.Fatalf("stream two did not wait for the event: Query = %v, %v", done, err)
	}
	time.Sleep(20 * time.Millisecond) // time for a wrongly ordered copy to run
	if string(got) != string(make([]byte, 15)) {
		t.Fatalf("stream two ran its copy before the event's work (read %q)", got)
	}
	release()
	syncStream(t, s2)
	if string(got) != "from stream one" {
		t.Fatalf("stream two read %q before stream one's write", got)
	}
}

// eventWaitIgnoresLaterWork: a wait covers the work before the record,
// not what is enqueued after it.
func eventWaitIgnoresLaterWork(t *testing.T, o opener) {
	x := newCrossStreams(t, o, 64)
	d, s1, s2, e, p := x.d, x.s1, x.s2, x.e, x.p
	ok(t, d.CopyHtoD(p, []byte("before the record"), s1))
	ok(t, e.Record(s1))
	release := hold(t, d, s1) // after the record: stream two must not wait for it
	ok(t, e.Wait(s2))
	got := make([]byte, 17)
	ok(t, d.CopyDtoH(got, p, s2))
	syncStream(t, s2) // returns while stream one is still held
	if string(got) != "before the record" {
		t.Errorf("stream two read %q after waiting on the event, want the write recorded before it", got)
	}
	if done, err := s1.Query(); err != nil || done {
		t.Errorf("stream one Query = %v, %v while held; want false, nil", done, err)
	}
	release()
	syncStream(t, s1)
}

// eventReRecord: recording an event again moves its mark.
func eventReRecord(t *testing.T, o opener) {
	d := o.fresh(t)
	s, e := streamAndEvent(t, d)
	release := hold(t, d, s)
	ok(t, e.Record(d.DefaultStream())) // nothing pending there
	if done, err := e.Query(); err != nil || !done {
		t.Fatalf("event recorded on an idle stream: Query = %v, %v; want true, nil", done, err)
	}
	ok(t, e.Record(s)) // now behind the held work
	if done, err := e.Query(); err != nil || done {
		t.Fatalf("event re-recorded behind held work: Query = %v, %v; want false, nil", done, err)
	}
	release()
	within(t, "Event.Synchronize", func() { ok(t, e.Synchronize()) })
}

// eventRecordCapturesEarlierWork: an event recorded before work is
// enqueued stays complete.
func eventRecordCapturesEarlierWork(t *testing.T, o opener) {
	d := o.fresh(t)
	s, e := streamAndEvent(t, d)
	ok(t, e.Record(s)) // nothing enqueued yet: complete at once
	within(t, "Event.Synchronize", func() { ok(t, e.Synchronize()) })
	release := hold(t, d, s)
	if done, err := e.Query(); err != nil || !done {
		t.Fatalf("an event recorded before held work reports %v, %v; want done", done, err)
	}
	release()
	syncStream(t, s)
}

func testStickyErrors(t *testing.T, o opener) {
	d := o.fresh(t)
	fl, isFL := d.(device.FuncLauncher)
	if !isFL {
		t.Skip("device is no device.FuncLauncher: no portable way to raise an asynchronous error")
	}
	backed(t, d)
	s := strm(t)(d.NewStream())
	defer func() { ok(t, s.Close()) }()
	boom := errors.New("kernel says no")
	ok(t, fl.LaunchFunc(s, 4, func(device.View, int, int) error { return boom }))
	ok(t, fl.LaunchFunc(s, 1, func(device.View, int, int) error { return nil }))
	var err error
	within(t, "Synchronize", func() { err = s.Synchronize() })
	if !errors.Is(err, boom) {
		t.Fatalf("Synchronize after a failing kernel = %v; want it to wrap the kernel's error", err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatalf("second Synchronize = %v; want nil (the error was reported)", err)
	}
	ok(t, fl.LaunchFunc(s, 1, func(device.View, int, int) error { return boom }))
	within(t, "Device.Synchronize", func() { err = d.Synchronize() })
	if !errors.Is(err, boom) {
		t.Fatalf("Device.Synchronize after a failing kernel = %v; want the kernel's error", err)
	}
}

// e2Wait makes an event on d, records it on d's default stream and waits
// for it from s.
func e2Wait(d device.Device, s device.Stream) error {
	e, err := d.NewEvent()
	if err != nil {
		return err
	}
	defer e.Close()
	if err := e.Record(d.DefaultStream()); err != nil {
		return err
	}
	return e.Wait(s)
}

func testDeviceSync(t *testing.T, o opener) {
	d := o.fresh(t)
	backed(t, d)
	var streams []device.Stream
	var ptrs []device.Ptr
	var outs [][]byte
	for i := range 4 {
		s := strm(t)(d.NewStream())
		streams = append(streams, s)
		p := ptr(t)(d.Malloc(512))
		ptrs = append(ptrs, p)
		ok(t, d.CopyHtoD(p, pattern(512, byte(i)), s))
		out := make([]byte, 512)
		ok(t, d.CopyDtoH(out, p, s))
		outs = append(outs, out)
	}
	within(t, "Device.Synchronize", func() { ok(t, d.Synchronize()) })
	for i, out := range outs {
		if !bytes.Equal(out, pattern(512, byte(i))) {
			t.Errorf("stream %d's copies had not finished after Device.Synchronize", i)
		}
		if done, err := streams[i].Query(); !done || err != nil {
			t.Errorf("stream %d Query after Device.Synchronize = %v, %v", i, done, err)
		}
	}
	for i := range streams {
		ok(t, streams[i].Close())
		ok(t, d.Free(ptrs[i]))
	}
}

func testStreamCloseWaits(t *testing.T, o opener) {
	d := o.fresh(t)
	backed(t, d)
	s := strm(t)(d.NewStream())
	p := ptr(t)(d.Malloc(1 << 16))
	defer func() { ok(t, d.Free(p)) }()
	ok(t, d.CopyHtoD(p, pattern(1<<16, 5), s))
	out := make([]byte, 1<<16)
	ok(t, d.CopyDtoH(out, p, s))
	within(t, "Stream.Close", func() { ok(t, s.Close()) })
	if !bytes.Equal(out, pattern(1<<16, 5)) {
		t.Errorf("Stream.Close returned before its work finished")
	}
}
