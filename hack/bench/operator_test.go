package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestCacheSyncedTakesTheLastControllerToStartWorkers(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "operator.log")
	start := time.Unix(1_800_000_000, 0)
	lines := `{"level":"info","ts":1800000000.5,"msg":"Starting EventSource","controller":"nodehealth"}
{"level":"info","ts":1800000001.25,"msg":"Starting workers","controller":"nodehealth","worker count":16}
{"level":"info","ts":"2027-01-15T08:00:02.75Z","msg":"Starting workers","controller":"nodehealthevent","worker count":16}
not json "msg":"Starting workers"
{"level":"info","ts":1800000009,"msg":"Reconciled"}
`
	if err := os.WriteFile(log, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	d, n := cacheSynced(log, start)
	if n != 2 {
		t.Fatalf("controllers: got %d, want 2", n)
	}
	if want := 2750 * time.Millisecond; d != want {
		t.Fatalf("synced after %s, want %s", d, want)
	}
}

func TestCacheSyncedBeforeAnyControllerStarted(t *testing.T) {
	log := filepath.Join(t.TempDir(), "operator.log")
	if err := os.WriteFile(log, []byte(`{"level":"info","ts":1800000000.5,"msg":"Starting manager"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if d, n := cacheSynced(log, time.Unix(1_800_000_000, 0)); n != 0 || d != 0 {
		t.Fatalf("got %s after %d controllers, want nothing", d, n)
	}
}
