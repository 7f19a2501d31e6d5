// Command pause is the sandbox ("pause") image of hack/realnode.sh's
// containerd: it holds a pod's namespaces open, reaps the children that
// the pod's processes leave to it (it is PID 1 of a pod that shares its PID
// namespace), and exits on SIGINT or SIGTERM. It is built from this source
// because no registry is reachable where the real node runs.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
