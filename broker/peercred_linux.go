package broker

import (
	"fmt"
	"syscall"
)

// readPeerCred reads SO_PEERCRED: the pid, uid and gid of the process
// that connected, as the kernel recorded them at connect(2), in the
// broker's pid namespace.
func readPeerCred(sc syscall.Conn) (peerCred, error) {
	raw, err := sc.SyscallConn()
	if err != nil {
		return peerCred{}, fmt.Errorf("broker: peer credentials: %w", err)
	}
	var cred *syscall.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return peerCred{}, fmt.Errorf("broker: peer credentials: %w", err)
	}
	if serr != nil {
		return peerCred{}, fmt.Errorf("broker: peer credentials (SO_PEERCRED): %w", serr)
	}
	return peerCred{pid: uint32(cred.Pid), uid: cred.Uid, gid: cred.Gid}, nil
}
