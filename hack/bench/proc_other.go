//go:build !linux

package main

import "os/exec"

// setProcAttrs does nothing outside Linux: there is no parent-death signal,
// so a killed benchmark may leave the operator running.
func setProcAttrs(*exec.Cmd) {}
