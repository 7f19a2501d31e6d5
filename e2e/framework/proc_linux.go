package framework

import (
	"os/exec"
	"syscall"
)

// setDieWithParent has the kernel kill cmd's process should this program
// die without stopping it, and puts the process in a group of its own, so
// that a terminal's Ctrl-C reaches only this program.
func setDieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
