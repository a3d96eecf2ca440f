package share

import (
	"encoding/binary"
	"errors"
	"testing"
)

// FuzzPools drives the pools with joins, leaves and moves read from the
// input and checks the rules after every step against a list of the
// members: the manual total never passes 100%; the auto pool keeps
// MinAutoPool while it has members; a refusal leaves the pools as they
// were; the members' byte shares never add up to more than the total; and
// the pools' counts are the members'.
func FuzzPools(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{1, 0x80, 0, 0, 0, 0, 0, 0, 0, 1, 0xf8, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 3, 1, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 1, 0x10, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const total = 80 << 30 // bytes, an H100's
		p := New("lease")
		var members []uint64 // each member's units (0: auto)
		for len(ops) > 0 {
			op := ops[0] % 4
			ops = ops[1:]
			var arg uint64
			if len(ops) >= 8 {
				arg = binary.LittleEndian.Uint64(ops)
				ops = ops[8:]
			}
			before := p
			var err error
			switch op {
			case 0: // join the auto pool
				if _, err = p.Join(0); err == nil {
					members = append(members, 0)
				}
			case 1: // join with a manual proportion
				u := arg%Unit + 1
				if _, err = p.Join(u); err == nil {
					members = append(members, u)
				}
			case 2: // leave
				if len(members) == 0 {
					continue
				}
				i := int(arg % uint64(len(members)))
				p.Leave(members[i])
				members = append(members[:i], members[i+1:]...)
			case 3: // move to another proportion, or to the auto pool
				if len(members) == 0 {
					continue
				}
				i := int(arg % uint64(len(members)))
				to := (arg >> 16) % (Unit + 1) // 0: auto
				if _, err = p.Move(members[i], to); err == nil {
					members[i] = to
				}
			}
			if err != nil {
				if !errors.Is(err, ErrProportion) {
					t.Fatalf("op %d: %v does not wrap ErrProportion", op, err)
				}
				if p != before {
					t.Fatalf("op %d refused (%v) but changed the pools: %+v, were %+v", op, err, p, before)
				}
			}
			checkPools(t, &p, members, total)
		}
	})
}

func checkPools(t *testing.T, p *Pools, members []uint64, total uint64) {
	t.Helper()
	var manual uint64
	auto := 0
	for _, u := range members {
		if u == 0 {
			auto++
		}
		manual += u
	}
	if p.Manual() != manual || p.Auto() != auto {
		t.Fatalf("pools say manual %d, auto %d; the members %d, %d", p.Manual(), p.Auto(), manual, auto)
	}
	if manual > Unit {
		t.Fatalf("manual total %s over 100%%", Pct(manual))
	}
	if auto > 0 && Unit-manual < MinAutoUnits {
		t.Fatalf("auto pool of %d member(s) left %s, under %s", auto, Pct(Unit-manual), Pct(MinAutoUnits))
	}
	var sum uint64
	for _, u := range members {
		sum += p.Bytes(u, total)
	}
	if sum > total {
		t.Fatalf("byte shares add up to %d, over the total %d", sum, total)
	}
}
