package kmsg

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// cursorFile is the cursor's file name inside Source.StateDir.
const cursorFile = "kmsg.cursor"

// cursor is how far the source got: the last record it processed, and the
// boot that record belongs to (sequence numbers restart at every boot).
type cursor struct {
	BootID string `json:"bootID"`
	Seq    uint64 `json:"seq"`
	// Gen counts cursor writes; the pipeline marks the occurrences each
	// write will cover with its generation (see Source.Sync).
	Gen uint64 `json:"gen,omitempty"`
}

// CommittedGeneration returns the generation of the durable cursor in
// stateDir, for the pipeline's Options.Checkpointed: occurrences spooled
// with a later generation are read again from the kernel log. When the
// cursor belongs to another boot (nothing of that boot is read again), or
// the boot id cannot be read (no cursor is kept at all), every spooled
// occurrence counts: the result is the largest generation.
func CommittedGeneration(stateDir, bootIDPath string) uint64 {
	const all = ^uint64(0)
	id, err := readBootID(valueOr(bootIDPath, DefaultBootIDPath))
	if err != nil || stateDir == "" {
		return all
	}
	c, ok, err := loadCursor(stateDir)
	switch {
	case err != nil || !ok:
		return 0 // the whole ring buffer is read again
	case c.BootID != id:
		return all
	}
	return c.Gen
}

// loadCursor reads the cursor from dir. ok is false when there is none; a
// file that cannot be decoded is an error, and the caller treats it as none.
func loadCursor(dir string) (c cursor, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, cursorFile))
	if errors.Is(err, fs.ErrNotExist) {
		return cursor{}, false, nil
	}
	if err != nil {
		return cursor{}, false, fmt.Errorf("reading kmsg cursor: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return cursor{}, false, fmt.Errorf("decoding kmsg cursor: %w", err)
	}
	if c.BootID == "" {
		return cursor{}, false, errors.New("decoding kmsg cursor: no boot id")
	}
	return c, true, nil
}

// saveCursor writes the cursor to dir atomically: a temporary file in the
// same directory, synced, then renamed over the old one, so that a crash
// leaves either the old cursor or the new one, never half of one.
func saveCursor(dir string, c cursor) error {
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encoding kmsg cursor: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating state directory: %w", err)
	}
	tmp, err := os.CreateTemp(dir, cursorFile+".*.tmp")
	if err != nil {
		return fmt.Errorf("creating kmsg cursor: %w", err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	_, err = tmp.Write(append(b, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing kmsg cursor: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, cursorFile)); err != nil {
		return fmt.Errorf("renaming kmsg cursor: %w", err)
	}
	return nil
}

// readBootID returns the kernel's boot id, a random UUID the kernel picks at
// every boot.
func readBootID(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading boot id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", fmt.Errorf("reading boot id: %s is empty", path)
	}
	return id, nil
}
