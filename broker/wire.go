package broker

// The wire: how a client and the broker frame their messages on the
// socket (brokerpb/broker.proto says what the messages are). A client
// writes the preface, then Requests; the broker writes Replies. Each
// message is a frame: its length in 4 bytes, big-endian, then its bytes.
//
// A frame is written with one write, from a buffer its writer keeps; a
// frame is read into the reader's buffer, which the next frame reuses
// (proto.Unmarshal copies what a message keeps). A reader states its
// bound: a frame past it ends the connection before its bytes are read.
// Nothing here is safe for concurrent use: a connection's owner
// serializes its writes, and one goroutine reads.

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"
)

const (
	// preface opens every connection, from the client: the protocol and
	// its version.
	preface = "vram broker 1\n"
	// http2Preface opens a connection of a client that speaks gRPC (a
	// vram from before this protocol), for the broker's log.
	http2Preface = "PRI * HTTP/2.0"
	// maxReplyBytes bounds a reply a client reads: the status of
	// thousands of leases.
	maxReplyBytes = 4 << 20
	// keptBufferBytes is the most a reader or writer keeps between
	// frames; a larger frame's buffer is let go after it.
	keptBufferBytes = 64 << 10
)

// frameReader reads the frames of a connection.
type frameReader struct {
	r   *bufio.Reader
	max int // the largest frame taken, in bytes
	hdr [4]byte
	buf []byte
}

func newFrameReader(r io.Reader, max int) *frameReader {
	return &frameReader{r: bufio.NewReader(r), max: max}
}

// read reads the next frame into m. A frame longer than the reader's
// bound is an error, and so is one that does not decode.
func (fr *frameReader) read(m proto.Message) error {
	if _, err := io.ReadFull(fr.r, fr.hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(fr.hdr[:])
	if int64(n) > int64(fr.max) {
		return fmt.Errorf("a frame of %d bytes, over the bound of %d: %w", n, fr.max, ErrInvalid)
	}
	if cap(fr.buf) < int(n) {
		fr.buf = make([]byte, n)
	}
	b := fr.buf[:n]
	if _, err := io.ReadFull(fr.r, b); err != nil {
		return unexpectedEOF(err)
	}
	if cap(fr.buf) > keptBufferBytes {
		fr.buf = nil
	}
	if err := proto.Unmarshal(b, m); err != nil {
		return fmt.Errorf("a frame of %d bytes that is not a %T: %v: %w", n, m, err, ErrInvalid)
	}
	return nil
}

// unexpectedEOF is err, but io.ErrUnexpectedEOF for an end in the middle
// of a frame.
func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// frameWriter writes frames to w, one write a frame.
type frameWriter struct {
	w   io.Writer
	buf []byte
}

// write writes m as one frame.
func (fw *frameWriter) write(m proto.Message) error {
	b, err := proto.MarshalOptions{}.MarshalAppend(append(fw.buf[:0], 0, 0, 0, 0), m)
	if err != nil {
		return err
	}
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	if fw.buf = b; cap(b) > keptBufferBytes {
		fw.buf = nil
	}
	_, err = fw.w.Write(b)
	return err
}
