package broker

// A vram manager's lease (vram.LeaseOptions.Broker, which is
// account.LeaseOptions.Broker): the broker At names, the dialer this
// package registers with the device-memory account (package account) for
// a socket given by name (the deprecated vram.WithBroker, $VRAM_BROKER for
// vram.Default), and the adapter that gives an account what it needs of a
// Lease (account.Lease) in the allocator's bytes.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/vramkit/vram/account"
)

func init() { account.RegisterBroker(dialNamed) }

// dialNamed is the dialer of a socket given by name (req.Socket).
func dialNamed(ctx context.Context, req account.LeaseRequest) (account.Lease, error) {
	return dialManagerLease(ctx, req.Socket, req, nil)
}

// At is the node broker on socket, as a vram manager asks it for its
// lease: vram.New(dev, vram.WithLease(vram.LeaseOptions{Broker:
// broker.At(socket)})). Nothing is dialed until the manager asks; opts
// are the client's (WithLogger defaults to the manager's logger). A plain
// value, safe to share.
func At(socket string, opts ...DialOption) account.Broker {
	return socketBroker{socket: socket, opts: opts}
}

// socketBroker is At's broker.
type socketBroker struct {
	socket string
	opts   []DialOption
}

func (b socketBroker) Lease(ctx context.Context, req account.LeaseRequest) (account.Lease, error) {
	return dialManagerLease(ctx, b.socket, req, b.opts)
}

func (b socketBroker) String() string { return b.socket }

// dialManagerLease connects to the broker on socket, finds the manager's
// device among the broker's and acquires the lease req asks for. The
// client is the lease's own: closing the lease closes it.
func dialManagerLease(ctx context.Context, socket string, req account.LeaseRequest, opts []DialOption) (account.Lease, error) {
	if req.Logger != nil {
		opts = append([]DialOption{WithLogger(req.Logger)}, opts...)
	}
	c, err := Dial(ctx, socket, opts...)
	if err != nil {
		return nil, err // it names the socket and what to do
	}
	d, err := FindDevice(c.Devices(), req.Options.Device, req.Device.ID)
	if err == nil && req.Device.TotalBytes != 0 && req.Device.TotalBytes != d.Total {
		err = fmt.Errorf("the broker's device %d (%s) has %d bytes, the manager's %d: not the same device: %w", d.Index, d.Name, d.Total, req.Device.TotalBytes, ErrInvalid)
	}
	if err != nil {
		return nil, errors.Join(err, c.Close())
	}
	o := req.Options
	l, err := c.Acquire(ctx, LeaseOptions{Device: d.Index, Name: o.Name, Proportion: o.Proportion, Cap: o.Cap})
	if err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return &managerLease{c: c, l: l, dev: d}, nil
}

// FindDevice finds a process's device among the broker's devs: the one
// spec names (its index, or its name as the broker's --devices gave it),
// or with spec "" the one whose ID is id (device.Info.ID). The error
// says first what may be given: each of the broker's devices, by index
// or name.
func FindDevice(devs []DeviceInfo, spec, id string) (DeviceInfo, error) {
	for _, d := range devs {
		switch {
		case spec != "" && (strconv.Itoa(d.Index) == spec || d.Name == spec):
			return d, nil
		case spec == "" && id != "" && d.ID == id:
			return d, nil
		}
	}
	names := make([]string, len(devs))
	for i, d := range devs {
		names[i] = fmt.Sprintf("%d or %s", d.Index, d.Name)
		if d.ID != "" && d.ID != d.Name {
			names[i] += " (id " + d.ID + ")"
		}
	}
	have := "name one of the broker's devices, " + strings.Join(names, "; ")
	switch {
	case spec != "":
		return DeviceInfo{}, fmt.Errorf("%s: it has no device %s: %w", have, clip(spec), ErrNotFound)
	case id == "":
		return DeviceInfo{}, fmt.Errorf("%s: this device has no id that another process would know it by (a private simulator?): %w", have, ErrNotFound)
	}
	return DeviceInfo{}, fmt.Errorf("%s, or serve this one: device %s is none of them: %w", have, clip(id), ErrNotFound)
}

// managerLease is a Lease as a vram manager sees it. Its figures are the
// allocator's: the context the process pays left out.
type managerLease struct {
	c   *Client
	l   *Lease
	dev DeviceInfo
}

var _ account.Lease = (*managerLease)(nil)

func toManager(b Budget) account.LeaseBudget {
	lb := account.LeaseBudget{Bytes: b.Bytes(), Guaranteed: b.Guaranteed - min(b.Guaranteed, b.Context)}
	if s := b.Shrink; s != nil {
		lb.Shrink, lb.Deadline, lb.Overdue = true, s.Deadline, s.Overdue
	}
	return lb
}

func (m *managerLease) Budget() account.LeaseBudget { return toManager(m.l.Budget()) }

func (m *managerLease) Changed() <-chan struct{} { return m.l.Changed() }

// most is the most the allocator may hold under the lease: the device, or
// the lease's cap, less the context.
func (m *managerLease) most() uint64 {
	top := m.dev.Total
	if c := m.l.Options().Cap; c > 0 {
		top = min(top, c)
	}
	ctx := m.l.Budget().Context
	return top - min(top, ctx)
}

func (m *managerLease) Claim(ctx context.Context, bytes uint64) (account.LeaseBudget, error) {
	b, err := m.l.Claim(ctx, min(bytes, m.most()))
	return toManager(b), err
}

// Report reports at most the device less the context (the broker's
// bound on a report): what is held is a fact, whatever the cap.
func (m *managerLease) Report(ctx context.Context, bytes uint64) (account.LeaseBudget, error) {
	top := m.dev.Total - min(m.dev.Total, m.l.Budget().Context)
	err := m.l.Report(ctx, min(bytes, top))
	return m.Budget(), err
}

func (m *managerLease) Err() error { return m.l.Err() }

func (m *managerLease) String() string {
	return fmt.Sprintf("lease %s of broker device %d (%s)", m.l.ID(), m.dev.Index, m.dev.Name)
}

// Close releases the lease and closes the client (which would release it
// all the same).
func (m *managerLease) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(m.l.Release(ctx), m.c.Close())
}
