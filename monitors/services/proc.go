package services

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// commLen is the most the kernel keeps of a process's name in
// /proc/<pid>/comm: TASK_COMM_LEN is 16 bytes with the terminating NUL, so
// nv-fabricmanager shows as nv-fabricmanage and nvidia-persistenced as
// nvidia-persiste.
const commLen = 15

// commOf is the name the kernel shows for a process that runs binary.
func commOf(binary string) string {
	if len(binary) > commLen {
		return binary[:commLen]
	}
	return binary
}

// proc is one process as /proc shows it.
type proc struct {
	pid int
	// start is field 22 of /proc/<pid>/stat: when the process started, in
	// clock ticks since boot. With the pid it tells a new process from the
	// old one when the kernel reuses a pid.
	start uint64
}

// errNoProcesses is a /proc without a single process directory: not a
// procfs, or not the host's.
var errNoProcesses = errors.New("no process directories")

// maxProcFile bounds what is read of a comm or stat file; stat is about 300
// bytes, and a comm at most 16.
const maxProcFile = 4096

// scanProcs lists, for each name in comms, the live processes whose
// /proc/<pid>/comm is that name. It returns an error only when procRoot
// cannot be listed or holds no process at all. A process that exits during
// the scan, or whose files cannot be read, is skipped; so are zombies,
// which have exited and only wait for their parent to reap them.
func scanProcs(procRoot string, comms map[string]bool) (map[string][]proc, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	found := map[string][]proc{}
	processes := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		processes++
		comm, err := readSmall(filepath.Join(procRoot, e.Name(), "comm"))
		if err != nil {
			continue
		}
		name := strings.TrimSuffix(string(comm), "\n")
		if !comms[name] {
			continue
		}
		stat, err := readSmall(filepath.Join(procRoot, e.Name(), "stat"))
		if err != nil {
			continue
		}
		state, start, err := parseStat(stat)
		if err != nil || state == 'Z' || state == 'X' {
			continue
		}
		found[name] = append(found[name], proc{pid: pid, start: start})
	}
	if processes == 0 {
		return nil, errNoProcesses
	}
	return found, nil
}

// readSmall reads at most maxProcFile bytes of a file.
func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, maxProcFile)
	n, err := f.Read(buf)
	if n == 0 && err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// statStartField is the index of starttime among the fields that follow
// the command name in /proc/<pid>/stat: the name is field 2, state field 3
// (index 0) and starttime field 22 (proc(5)).
const statStartField = 22 - 3

// parseStat returns the state letter and the start time (clock ticks after
// boot) from /proc/<pid>/stat. The command name in it is in parentheses and
// may itself contain spaces and parentheses (a process may name itself
// anything), so the fields are read after the last ')'.
func parseStat(stat []byte) (state byte, start uint64, err error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, errors.New("no command name in stat")
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) <= statStartField {
		return 0, 0, fmt.Errorf("stat has %d fields after the command name, want more than %d", len(fields), statStartField)
	}
	if len(fields[0]) != 1 {
		return 0, 0, fmt.Errorf("stat state %q is not one letter", fields[0])
	}
	start, err = strconv.ParseUint(fields[statStartField], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("stat starttime: %w", err)
	}
	return fields[0][0], start, nil
}

// userHZ is the unit of the times in /proc/<pid>/stat: the kernel reports
// them in USER_HZ, which is 100 on every architecture Linux supports
// (sysconf(_SC_CLK_TCK)), whatever the kernel's own tick rate.
const userHZ = 100

// bootTime reads the host's boot time, the btime line of procRoot/stat.
func bootTime(procRoot string) (time.Time, error) {
	f, err := os.Open(filepath.Join(procRoot, "stat"))
	if err != nil {
		return time.Time{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "btime ")
		if !ok {
			continue
		}
		secs, err := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
		if err != nil || secs <= 0 {
			return time.Time{}, fmt.Errorf("reading btime %q", rest)
		}
		return time.Unix(secs, 0), nil
	}
	if err := sc.Err(); err != nil {
		return time.Time{}, err
	}
	return time.Time{}, errors.New("no btime line")
}

// maxStartTicks bounds the start times startedAt converts: 100 years of
// ticks, far less than what overflows a time.Duration.
const maxStartTicks = 100 * 365 * 24 * 3600 * userHZ

// startedAt is when a process that started start ticks after boot started;
// false when the boot time is not known or start is out of range.
func startedAt(boot time.Time, start uint64) (time.Time, bool) {
	if boot.IsZero() || start > maxStartTicks {
		return time.Time{}, false
	}
	return boot.Add(time.Duration(start) * (time.Second / userHZ)), true
}
