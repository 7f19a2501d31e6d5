package main

import (
	"os"
	"strconv"
	"strings"
)

// userHZ is the unit of the CPU times in /proc/<pid>/stat (USER_HZ, 100 on
// every Linux architecture in use).
const userHZ = 100

// takeCPU returns the CPU seconds (user + system) each process group on
// this machine has used so far, from /proc. Processes that exit in between
// two snapshots are not counted; every process the benchmark measures lives
// through its phase.
func takeCPU() cpuSnapshot {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := strconv.Itoa(os.Getpid())
	out := cpuSnapshot{}
	for _, e := range entries {
		pid := e.Name()
		if pid[0] < '0' || pid[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		// Fields after the command: state is the first, utime the 12th and stime the 13th.
		f := strings.Fields(s[end+1:])
		if len(f) < 13 {
			continue
		}
		utime, err1 := strconv.ParseFloat(f[11], 64)
		stime, err2 := strconv.ParseFloat(f[12], 64)
		if err1 != nil || err2 != nil {
			continue
		}
		group := cpuGroup(s[open+1 : end])
		if pid == self {
			group = "harness (this program)"
		}
		out[group] += (utime + stime) / userHZ
	}
	return out
}
