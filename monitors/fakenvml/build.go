package fakenvml

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"
)

const (
	// LibraryName is the file name Build gives the library, the name go-nvml
	// loads by default.
	LibraryName = "libnvidia-ml.so.1"
	// ScenarioEnv is the environment variable that names the scenario file.
	// The library reads it at each nvmlInit that follows a full shutdown.
	ScenarioEnv = "GPUHEALTH_FAKENVML_SCENARIO"
)

// Build compiles the fake library into dir with gcc and returns the path of
// dir/libnvidia-ml.so.1. It compiles the C files next to this Go file, so it
// needs the source tree: it fails in a binary built with -trimpath or moved
// away from its sources.
func Build(dir string) (string, error) {
	src, err := sourceDir()
	if err != nil {
		return "", err
	}
	files, err := filepath.Glob(filepath.Join(src, "*.c"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("finding the C sources in %s: none found", src)
	}
	out := filepath.Join(dir, LibraryName)
	// The same command as the Makefile's; keep the two in step.
	args := append([]string{"-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-o", out}, files...)
	args = append(args, "-lpthread")
	if b, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("compiling %s: %w\n%s", out, err, b)
	}
	return out, nil
}

// sourceDir is the directory of this file, where the C sources live.
func sourceDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("locating the fakenvml sources: no caller information")
	}
	dir := filepath.Dir(file)
	if _, err := os.Stat(filepath.Join(dir, "nvml.c")); err != nil {
		return "", fmt.Errorf("locating the fakenvml sources: %w", err)
	}
	return dir, nil
}

// At formats t as an absolute scenario time, @<unix seconds>.<nanoseconds>,
// for lines a test appends while the library runs.
func At(t time.Time) string {
	return fmt.Sprintf("@%d.%09d", t.Unix(), t.Nanosecond())
}
