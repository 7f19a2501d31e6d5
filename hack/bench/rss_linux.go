package main

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// takeRSS returns the resident memory of each process group on this
// machine now (VmRSS, summed over a group's processes) and its peak
// (VmHWM, the largest of them), in bytes, from /proc/<pid>/status.
func takeRSS() (now, peak map[string]float64) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, nil
	}
	self := strconv.Itoa(os.Getpid())
	now, peak = map[string]float64{}, map[string]float64{}
	for _, e := range entries {
		pid := e.Name()
		if pid[0] < '0' || pid[0] > '9' {
			continue
		}
		f, err := os.Open("/proc/" + pid + "/status")
		if err != nil {
			continue
		}
		var comm string
		var rss, hwm float64
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			switch k {
			case "Name":
				comm = strings.TrimSpace(v)
			case "VmRSS":
				rss = kib(v)
			case "VmHWM":
				hwm = kib(v)
			}
		}
		_ = f.Close()
		if comm == "" || rss == 0 {
			continue // a kernel thread, or gone
		}
		group := cpuGroup(comm)
		if pid == self {
			group = "harness (this program)"
		}
		now[group] += rss
		peak[group] = max(peak[group], hwm)
	}
	return now, peak
}

// processRSS returns one process's resident memory (VmRSS) in bytes, 0
// when it cannot be read.
func processRSS(pid int) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(line, ":"); ok && k == "VmRSS" {
			return kib(v)
		}
	}
	return 0
}

// kib parses a /proc/<pid>/status size ("  123456 kB") into bytes.
func kib(v string) float64 {
	f := strings.Fields(v)
	if len(f) == 0 {
		return 0
	}
	n, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	return n * 1024
}
