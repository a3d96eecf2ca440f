package vram

// The allocator configuration from the environment, as PyTorch's
// PYTORCH_CUDA_ALLOC_CONF: VRAM_ALLOC_CONF="kind:pool,expandable:true,
// limit:8GiB,release_threshold:1GiB", read by Default, by the C library
// and by the vram command: one value (AllocConf), an account.Choice and a
// cap.

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/internal/units"
)

// AllocConfEnv is the environment variable Default reads its allocator
// configuration from.
const AllocConfEnv = "VRAM_ALLOC_CONF"

// ErrAllocConf is wrapped by the errors of ParseAllocConf.
var ErrAllocConf = errors.New("bad allocator configuration")

// allocConfKeys are the keys ParseAllocConf takes, in the order its
// errors list them.
var allocConfKeys = []string{"kind", "expandable", "limit", "release_threshold"}

// allocConf is a parsed configuration; a nil field was not given.
type allocConf struct {
	kind       *AllocatorKind
	expandable *bool
	limit      *uint64
	release    *uint64
}

// AllocConf is an allocator configuration as ReadAllocConf reads it: the
// allocator chosen and the cap. A plain value.
type AllocConf struct {
	Allocator account.Choice // as WithAllocatorChoice takes it
	Cap       uint64         // limit: the cap (WithCap); 0: none
	chosen    bool           // a key chose the allocator (kind, expandable, release_threshold)
}

// Options are the manager options of c: WithAllocatorChoice when a key
// chose the allocator, WithCap when a limit was given.
func (c AllocConf) Options() []Option {
	var opts []Option
	if c.chosen {
		opts = append(opts, WithAllocatorChoice(c.Allocator))
	}
	if c.Cap > 0 {
		opts = append(opts, WithCap(c.Cap))
	}
	return opts
}

// ReadAllocConf reads an allocator configuration — comma-separated
// key:value pairs, each key at most once:
//
//	kind               pool, direct or async, or an alias of the allocator
//	                   that names the kind, such as cubie's cupy, default
//	                   and cupy_async (ParseAllocatorKind)
//	expandable         true or false: with kind pool, alloc.Expandable or the
//	                   segment alloc.Pool; unset, Expandable where the device
//	                   manages virtual memory
//	limit              a size such as 8GiB: a cap on the bytes the
//	                   manager's arrays take (WithCap)
//	release_threshold  a size: the cached bytes kept when memory is given
//	                   back — the async pool's at synchronization points
//	                   (0 gives all back), Expandable's on Trim; needs kind
//	                   async, or kind pool with expandable:true
//
// Anything else — an unknown or repeated key, a bad value, a key that does
// not apply to the kind — is an error wrapping ErrAllocConf that names the
// key. An empty string chooses nothing.
func ReadAllocConf(s string) (AllocConf, error) {
	c, err := parseAllocConf(s)
	if err != nil {
		return AllocConf{}, fmt.Errorf("%s %s: %w", AllocConfEnv, clipConf(s), err)
	}
	return c.value(), nil
}

// ParseAllocConf is ReadAllocConf(s).Options(): the configuration as
// manager options.
func ParseAllocConf(s string) ([]Option, error) {
	c, err := ReadAllocConf(s)
	if err != nil {
		return nil, err
	}
	return c.Options(), nil
}

// AllocConfFromEnv is ParseAllocConf of $VRAM_ALLOC_CONF (no options when
// it is unset or empty).
func AllocConfFromEnv() ([]Option, error) { return ParseAllocConf(os.Getenv(AllocConfEnv)) }

func parseAllocConf(s string) (allocConf, error) {
	var c allocConf
	if strings.TrimSpace(s) == "" {
		return c, nil
	}
	seen := map[string]bool{}
	for _, entry := range strings.Split(s, ",") {
		key, val, ok := strings.Cut(entry, ":")
		key, val = strings.ToLower(strings.TrimSpace(key)), strings.TrimSpace(val)
		switch {
		case strings.TrimSpace(entry) == "":
			return c, fmt.Errorf("an empty entry; want key:value pairs separated by commas: %w", ErrAllocConf)
		case !ok || val == "":
			return c, noValue(entry)
		case seen[key]:
			return c, fmt.Errorf("key %s is given twice: %w", clipConf(key), ErrAllocConf)
		}
		seen[key] = true
		if err := c.set(key, val); err != nil {
			return c, err
		}
	}
	return c, c.check()
}

// clipConf quotes a piece of the configuration for a message: at most
// 40 bytes of it.
func clipConf(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%q…", s[:40])
	}
	return fmt.Sprintf("%q", s)
}

// noValue is the error of an entry with no key:value pair, with the
// entry as it should have been written: "kind=pool" is kind:pool.
func noValue(entry string) error {
	e := strings.TrimSpace(entry)
	if k, v, ok := strings.Cut(e, "="); ok && strings.TrimSpace(v) != "" {
		return fmt.Errorf("entry %s: keys and values are separated by ':', not '='; write %s: %w",
			clipConf(e), clipConf(strings.TrimSpace(k)+":"+strings.TrimSpace(v)), ErrAllocConf)
	}
	key, _, _ := strings.Cut(e, ":")
	key = strings.TrimSpace(key)
	return fmt.Errorf("key %s has no value; write %s: %w", clipConf(key), clipConf(key+":VALUE"), ErrAllocConf)
}

// set reads one key's value.
func (c *allocConf) set(key, val string) error {
	switch key {
	case "kind":
		if strings.EqualFold(val, alloc.NameExpandable) {
			return fmt.Errorf("kind %s: expandable is a choice of kind pool; write kind:pool,expandable:true: %w", clipConf(val), ErrAllocConf)
		}
		k, err := ParseAllocatorKind(val)
		if err != nil {
			return fmt.Errorf("kind %s: want %s: %w", clipConf(val), kindNames(), ErrAllocConf)
		}
		c.kind = &k
	case "expandable":
		var b bool
		switch strings.ToLower(val) {
		case "true":
			b = true
		case "false":
		default:
			return fmt.Errorf("expandable %s: want true or false: %w", clipConf(val), ErrAllocConf)
		}
		c.expandable = &b
	case "limit", "release_threshold":
		n, err := units.ParseSize(val)
		if err != nil {
			return fmt.Errorf("%s %s: want a size such as 8GiB: %w", key, clipConf(val), ErrAllocConf)
		}
		if key == "limit" && n == 0 {
			return fmt.Errorf("limit %s: want a size above 0 (leave the key out for no limit): %w", clipConf(val), ErrAllocConf)
		}
		if key == "limit" {
			c.limit = &n
		} else {
			c.release = &n
		}
	default:
		return fmt.Errorf("unknown key %s; want %s: %w", clipConf(key), strings.Join(allocConfKeys, ", "), ErrAllocConf)
	}
	return nil
}

// check refuses keys that do not apply to the kind.
func (c allocConf) check() error {
	kind := Pool
	if c.kind != nil {
		kind = *c.kind
	}
	if c.expandable != nil && kind != Pool {
		return fmt.Errorf("expandable applies to kind pool, not %v: %w", kind, ErrAllocConf)
	}
	if c.release != nil {
		switch {
		case kind == Direct:
			return fmt.Errorf("release_threshold: kind direct caches nothing; use kind async, or kind pool with expandable:true: %w", ErrAllocConf)
		case kind == Pool && (c.expandable == nil || !*c.expandable):
			return fmt.Errorf("release_threshold: with kind pool it needs expandable:true (the segment pool has none): %w", ErrAllocConf)
		}
	}
	return nil
}

// value turns c into the configuration it reads as.
func (c allocConf) value() AllocConf {
	var v AllocConf
	if c.limit != nil {
		v.Cap = *c.limit
	}
	ch := &v.Allocator
	if c.kind != nil {
		ch.Kind, v.chosen = *c.kind, true
	}
	if c.expandable != nil {
		ch.Entry, v.chosen = poolEntry(alloc.NamePool), true
		if *c.expandable {
			ch.Entry = poolEntry(alloc.NameExpandable)
		}
		if c.release != nil {
			ch.Configs.Expandable.ReleaseThreshold = *c.release
		}
	}
	if c.release != nil && ch.Kind == AsyncPool {
		ch.Configs.Async = alloc.AsyncConfig{ReleaseThreshold: *c.release, ReleaseAtSync: *c.release == 0}
	}
	return v
}
