//go:build !linux

package main

// takeRSS needs /proc; elsewhere memory is not reported.
func takeRSS() (now, peak map[string]float64) { return nil, nil }

// processRSS needs /proc too.
func processRSS(int) float64 { return 0 }
