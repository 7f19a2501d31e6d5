package spool

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/api/xid"
)

// Record is one finding's unacknowledged state: what the pipeline still has
// to write to the apiserver for one NodeHealthEvent.
type Record struct {
	// Spec is the event's spec; xid.EventName of it is the record's name.
	Spec gpuhealthv1alpha1.NodeHealthEventSpec `json:"spec"`
	// Base is the event's status.count on the apiserver when the pipeline
	// last read or wrote it; -1 means not known yet (the object may not
	// exist). Writing Base+Pending as an absolute count makes a replay
	// after a crash idempotent: a record whose write landed but whose file
	// was not removed yet writes the same count again.
	Base int64 `json:"base"`
	// Pending is the number of occurrences not yet counted on the apiserver.
	Pending int64 `json:"pending"`
	// FirstSeen and LastSeen bound the pending occurrences.
	FirstSeen time.Time `json:"firstSeen"`
	LastSeen  time.Time `json:"lastSeen"`
	// Resolved is the state to write; ResolvedAt is set with it.
	Resolved   bool       `json:"resolved,omitempty"`
	ResolvedAt *time.Time `json:"resolvedAt,omitempty"`
	// StateChanged is true when Resolved changed since the last write.
	StateChanged bool `json:"stateChanged,omitempty"`
	// Unsealed is how many of the Pending occurrences came from a source
	// that keeps a read position (the kmsg cursor) after its last durable
	// position of generation UnsealedGen-1: when the position of
	// generation UnsealedGen was never written (a crash in between), the
	// source reads them again after a restart, so they are taken out.
	Unsealed    int64  `json:"unsealed,omitempty"`
	UnsealedGen uint64 `json:"unsealedGen,omitempty"`
	// Object is the name of the NodeHealthEvent the record is written to
	// when that is not Name(): the finding's own name was taken by another
	// finding's object, and it falls back to an alternate name
	// (NodeHealthEventSpec.AlternateEventName). Empty means Name(). Base
	// counts the occurrences on this object.
	Object string `json:"object,omitempty"`
}

// Name is the record's file name: the event's deterministic name.
func (r *Record) Name() string { return xid.EventName(&r.Spec) }

// rank orders severities for eviction: lower is dropped first.
func rank(s gpuhealthv1alpha1.Severity) int {
	switch s {
	case gpuhealthv1alpha1.SeverityFatal:
		return 2
	case gpuhealthv1alpha1.SeverityDegraded:
		return 1
	default:
		return 0
	}
}

// Spool is a directory of records, one JSON file per NodeHealthEvent, each
// written to a temporary file, synced and renamed into place so that a crash
// leaves either the old or the new record. It holds at most Max records:
// when a new record does not fit, the oldest Info record is dropped first,
// then the oldest Degraded one; a Fatal record is never dropped (the spool
// grows past Max instead). Spool is safe for concurrent use.
type Spool struct {
	dir string
	max int

	mu sync.Mutex
	// index maps a record name to its severity and last-seen time, for
	// eviction without reading files.
	index map[string]indexEntry
}

type indexEntry struct {
	severity gpuhealthv1alpha1.Severity
	lastSeen time.Time
}

const (
	suffix    = ".json"
	tmpSuffix = ".tmp"
	// DefaultMax is the default bound on records. A node has at most a few
	// hundred distinct findings (8 GPUs × 18 links × a few counters), so
	// 2,048 leaves room for an outage of hours without dropping any.
	DefaultMax = 2048
)

// Open opens (creating if needed) the spool in dir with room for limit records
// (DefaultMax when limit <= 0) and returns it with the records it already held,
// for replay. Files that cannot be parsed are moved aside with a ".corrupt"
// suffix and reported in the error list, never deleted.
func Open(dir string, limit int) (*Spool, []Record, []error, error) {
	if limit <= 0 {
		limit = DefaultMax
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, nil, fmt.Errorf("creating spool directory %s: %w", dir, err)
	}
	s := &Spool{dir: dir, max: limit, index: map[string]indexEntry{}}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("reading spool directory %s: %w", dir, err)
	}
	var records []Record
	var problems []error
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasSuffix(name, tmpSuffix):
			_ = os.Remove(filepath.Join(dir, name)) // an interrupted write: the previous file (if any) is intact
			continue
		case !strings.HasSuffix(name, suffix) || e.IsDir():
			continue
		}
		path := filepath.Join(dir, name)
		data, err := os.ReadFile(path)
		var r Record
		if err == nil {
			err = json.Unmarshal(data, &r)
		}
		if err == nil && r.Name()+suffix != name {
			err = fmt.Errorf("record is for %s", r.Name())
		}
		if err != nil {
			problems = append(problems, fmt.Errorf("spool record %s: %w (moved aside)", name, err))
			_ = os.Rename(path, path+".corrupt")
			continue
		}
		records = append(records, r)
		s.index[r.Name()] = indexEntry{severity: r.Spec.Severity, lastSeen: r.LastSeen}
	}
	sort.Slice(records, func(i, j int) bool { return records[i].FirstSeen.Before(records[j].FirstSeen) })
	return s, records, problems, nil
}

// Len returns the number of records held.
func (s *Spool) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.index)
}

// Put writes r, replacing the record of the same name. When r is new and the
// spool is full it first drops a lower-or-equal severity record (oldest Info
// first, then oldest Degraded) and returns the dropped records' names; when
// nothing can be dropped for a non-Fatal r, r itself is not stored and
// Put returns ErrFull.
func (s *Spool) Put(r *Record) (dropped []string, err error) {
	name := r.Name()
	data, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encoding spool record %s: %w", name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.index[name]; !ok && len(s.index) >= s.max {
		victim, ok := s.victim(r.Spec.Severity)
		switch {
		case ok:
			if err := os.Remove(filepath.Join(s.dir, victim+suffix)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("dropping spool record %s: %w", victim, err)
			}
			delete(s.index, victim)
			dropped = append(dropped, victim)
		case r.Spec.Severity != gpuhealthv1alpha1.SeverityFatal:
			return nil, ErrFull
		}
	}
	if err := writeFile(filepath.Join(s.dir, name+suffix), data); err != nil {
		return dropped, err
	}
	s.index[name] = indexEntry{severity: r.Spec.Severity, lastSeen: r.LastSeen}
	return dropped, nil
}

// ErrFull is returned by Put for a non-Fatal record that found no room.
var ErrFull = errors.New("spool is full of findings at least as severe")

// victim picks the record to drop to make room for one of severity sev: the
// lowest severity first, then the oldest; never a Fatal one and never one
// more severe than sev.
func (s *Spool) victim(sev gpuhealthv1alpha1.Severity) (string, bool) {
	best, found := "", false
	var bestEntry indexEntry
	for name, e := range s.index {
		if e.severity == gpuhealthv1alpha1.SeverityFatal || rank(e.severity) > rank(sev) {
			continue
		}
		if !found || rank(e.severity) < rank(bestEntry.severity) ||
			(rank(e.severity) == rank(bestEntry.severity) && e.lastSeen.Before(bestEntry.lastSeen)) {
			best, bestEntry, found = name, e, true
		}
	}
	return best, found
}

// Delete removes the record of that name; a missing record is not an error.
func (s *Spool) Delete(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.index, name)
	if err := os.Remove(filepath.Join(s.dir, name+suffix)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing spool record %s: %w", name, err)
	}
	return nil
}

// writeFile replaces path atomically: temporary file, fsync, rename.
func writeFile(path string, data []byte) error {
	tmp := path + tmpSuffix
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("writing spool record: %w", err)
	}
	_, werr := f.Write(data)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("writing spool record %s: %w", filepath.Base(path), err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("writing spool record %s: %w", filepath.Base(path), err)
	}
	return nil
}
