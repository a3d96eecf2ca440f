package trace

import "io"

// DecodePickle is decodePickle for the tests: the value, without the
// byte count.
func DecodePickle(r io.Reader) (any, error) {
	v, _, err := decodePickle(r)
	return v, err
}
