//go:build !linux

package broker

import (
	"errors"
	"syscall"
)

// readPeerCred is Linux's SO_PEERCRED; elsewhere the broker refuses
// connections, as it cannot tell who they are.
func readPeerCred(syscall.Conn) (peerCred, error) {
	return peerCred{}, errors.New("broker: peer credentials are read on Linux only (SO_PEERCRED)")
}
