//go:build !linux

package framework

import "os/exec"

// setDieWithParent does nothing outside Linux: there is no parent-death
// signal, so a killed program may leave its process running.
func setDieWithParent(*exec.Cmd) {}
