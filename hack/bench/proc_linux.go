package main

import (
	"os/exec"
	"syscall"
)

// setProcAttrs makes the kernel kill the operator should the benchmark die
// without stopping it, and keeps a terminal's Ctrl-C for the benchmark, which
// stops the operator itself before it deletes the cluster.
func setProcAttrs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
