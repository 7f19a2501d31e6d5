//go:build nvmlreal

package nvmlreal

import (
	"bytes"
	"debug/elf"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// DirEnv names the directory that holds NVIDIA's libnvidia-ml.so.1 (and
// nvidia-smi and VERSION), as hack/nvml535.sh prints it.
const DirEnv = "GPUHEALTH_NVML_REAL_DIR"

// library is NVIDIA's NVML library as hack/nvml535.sh unpacked it.
type library struct {
	// dir holds libnvidia-ml.so.1; the agent gets it as LD_LIBRARY_PATH.
	dir string
	// path is dir/libnvidia-ml.so.1.
	path string
	// file is the name the link points to, libnvidia-ml.so.<driver>.
	file string
	// driver is the driver version in that name, e.g. 535.261.03.
	driver string
	// pkg is the Debian package version from dir/VERSION; empty when the
	// directory has no VERSION file.
	pkg string
}

// realLibrary returns the library $GPUHEALTH_NVML_REAL_DIR names, and skips
// the test when the variable is unset (make nvml-real always sets it).
func realLibrary(t *testing.T) library {
	t.Helper()
	dir := os.Getenv(DirEnv)
	if dir == "" {
		t.Skipf("%s is unset: `make nvml-real` fetches NVIDIA's libnvidia-ml.so.1 of driver branch 535 (hack/nvml535.sh) and sets it", DirEnv)
	}
	l := library{dir: dir, path: filepath.Join(dir, "libnvidia-ml.so.1")}
	target, err := filepath.EvalSymlinks(l.path)
	if err != nil {
		t.Fatalf("%s=%s has no libnvidia-ml.so.1: %v", DirEnv, dir, err)
	}
	l.file = filepath.Base(target)
	l.driver = strings.TrimPrefix(l.file, "libnvidia-ml.so.")
	if b, err := os.ReadFile(filepath.Join(dir, "VERSION")); err == nil {
		l.pkg = strings.TrimSpace(string(b))
	}
	return l
}

// describe names the library for logs: its file, the package it came
// from, and whether NVML's own version string (nvmlSystemGetNVMLVersion's
// answer, "12.<driver>" for CUDA 12 drivers) is in its read-only data,
// which ties the driver version to the library's contents rather than to
// its file name.
func (l library) describe(t *testing.T) string {
	t.Helper()
	s := l.file
	if l.pkg != "" {
		s += " (Debian libnvidia-ml1 " + l.pkg + ")"
	}
	f, err := elf.Open(l.path)
	if err != nil {
		t.Fatalf("reading %s: %v", l.path, err)
	}
	defer func() { _ = f.Close() }()
	if sec := f.Section(".rodata"); sec != nil {
		if data, err := sec.Data(); err == nil && bytes.Contains(data, []byte("."+l.driver+"\x00")) {
			s += ", NVML version string ending in " + l.driver + " in .rodata"
		}
	}
	return s
}

// nvmlFunctions returns the NVML functions an ELF shared library exports.
func nvmlFunctions(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	defer func() { _ = f.Close() }()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatalf("reading the dynamic symbols of %s: %v", path, err)
	}
	out := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC && strings.HasPrefix(s.Name, "nvml") {
			out[s.Name] = true
		}
	}
	return out
}
