package broker

// Lease tokens: the secret that proves a lease is one's own when it is
// taken back after a broker restart.
//
// A lease belongs to the connection that acquired it; a restart ends
// every connection, and a lease id is public (status shows it), so a
// rejoin needs a proof that neither the id nor the pid gives. At acquire
// (and at each rejoin) the broker hands the holder a token, HMAC-SHA256
// under the broker's key of the lease id, the holder's uid and the
// broker's instance, and keeps nothing: a restarted broker with the same
// key recomputes it from the rejoin's id, the connection's uid and the
// instance the rejoin names, and compares. The instance in the token is
// what makes "a restart the client saw" a fact: a token this broker gave
// names this broker. The key lives in a file of the broker's
// own (Config.KeyFile, beside its socket: DefaultKeyFile), made at the
// first start: 32 random bytes, mode 0600, in a directory owned by the
// broker's user and closed to others (checkDir). Without a key file the
// key is new at every start, and no lease is taken back after a restart.

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

const (
	keyBytes   = 32
	tokenBytes = 16
	// tokenLabel separates the broker's tokens from any other use of
	// its key.
	tokenLabel = "vram broker lease token v2"
)

// DefaultKeyFile is where `vram broker` keeps its key for a socket: beside
// it, as SOCKET.key.
func DefaultKeyFile(socket string) string { return socket + ".key" }

// signer makes and checks the tokens of a broker's key. It keeps one
// keyed HMAC, reset for each token, so that a token costs no new hash
// state; it is not safe for concurrent use (a Server's is used under its
// mu).
type signer struct {
	mac hash.Hash
	msg [len(tokenLabel) + 20]byte // the message signed: the label, then the lease id, uid and broker instance
	sum [sha256.Size]byte
}

func newSigner(key []byte) *signer {
	s := &signer{mac: hmac.New(sha256.New, key)}
	copy(s.msg[:], tokenLabel)
	return s
}

// of is the token of lease id held by uid, given by broker instance
// broker.
func (s *signer) of(id uint64, uid uint32, broker uint64) []byte {
	return append([]byte(nil), s.sign(id, uid, broker)...)
}

// sign is the token of lease id held by uid, given by broker instance
// broker, in s's own buffer: valid until the next call.
func (s *signer) sign(id uint64, uid uint32, broker uint64) []byte {
	b := s.msg[len(tokenLabel):]
	binary.BigEndian.PutUint64(b[:8], id)
	binary.BigEndian.PutUint32(b[8:12], uid)
	binary.BigEndian.PutUint64(b[12:], broker)
	s.mac.Reset()
	s.mac.Write(s.msg[:])
	return s.mac.Sum(s.sum[:0])[:tokenBytes]
}

// matches reports whether token is lease id's for uid, given by instance
// broker, in time that does not depend on where they differ.
func (s *signer) matches(id uint64, uid uint32, broker uint64, token []byte) bool {
	return hmac.Equal(s.sign(id, uid, broker), token)
}

// newKey is a random key.
func newKey() []byte {
	k := make([]byte, keyBytes)
	_, _ = rand.Read(k)
	return k
}

// loadKey reads the key at path, or makes it there when there is none:
// 32 bytes, a regular file of the broker's user that no one else may
// read, in a directory that is the broker's user's and closed to others.
// A file that is anything else is refused, naming what is wrong.
func loadKey(path string) ([]byte, error) {
	if err := checkDir(filepath.Dir(path), "the key's directory"); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|oNoFollow, 0o600)
	if err == nil {
		return writeKey(f, path)
	}
	if !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("broker: make the key file %s: %w", path, err)
	}
	f, err = os.OpenFile(path, os.O_RDONLY|oNoFollow, 0)
	if err != nil {
		return nil, fmt.Errorf("broker: key file %s: %w; remove it if it is not the broker's", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("broker: key file %s: %w", path, err)
	}
	if err := checkOwn(fi, path, "key file"); err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o077 != 0 || fi.Size() != keyBytes {
		return nil, errorf(ErrInvalid, "broker: key file %s is a %v of mode %#o and %d bytes: want a regular file of mode 0600 and %d bytes; remove it, and a new one is made",
			path, fi.Mode().Type(), fi.Mode().Perm(), fi.Size(), keyBytes)
	}
	key := make([]byte, keyBytes)
	if _, err := io.ReadFull(f, key); err != nil {
		return nil, fmt.Errorf("broker: read the key file %s: %w", path, err)
	}
	return key, nil
}

// writeKey fills the new key file f with a random key and syncs it; on
// failure it removes the file, which it made.
func writeKey(f *os.File, path string) ([]byte, error) {
	key := newKey()
	_, err := f.Write(key)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("broker: write the key file %s: %w", path, err)
	}
	return key, nil
}
