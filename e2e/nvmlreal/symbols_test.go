//go:build nvmlreal

package nvmlreal

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/gpuhealth/gpuhealth/monitors/fakenvml"
	"github.com/gpuhealth/gpuhealth/monitors/nvml"
)

// fakeFunctions builds the fake NVML library and returns the NVML
// functions it exports: exactly those the agent calls in its tests
// (monitors/fakenvml/README.md), so a call added to the agent shows up
// here once the fake exports it, which its tests need anyway.
func fakeFunctions(t *testing.T) map[string]bool {
	t.Helper()
	path, err := fakenvml.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fns := nvmlFunctions(t, path)
	if len(fns) == 0 {
		t.Fatalf("the fake library %s exports no NVML function", path)
	}
	return fns
}

// TestAgentCallsAreInTheRealLibrary checks that NVIDIA's library of the
// oldest supported branch exports every NVML function the agent calls
// without looking it up first. go-nvml binds symbols lazily: a call to one
// the driver lacks aborts the agent ("symbol lookup error") the first time
// it is made, which on a node means a crash loop.
func TestAgentCallsAreInTheRealLibrary(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	nv := realLibrary(t)
	fake := fakeFunctions(t)
	have := nvmlFunctions(t, nv.path)
	g.Expect(have).NotTo(BeEmpty(), "%s exports no NVML function", nv.path)

	for _, s := range nvml.OptionalSymbols {
		g.Expect(fake).To(HaveKey(s), "optional call %s is not in the fake library, so no test exercises it", s)
		t.Logf("Looked up before use, not required: %s (in %s: %t)", s, nv.file, have[s])
	}
	var required, missing []string
	for _, s := range sortedKeys(fake) {
		if slices.Contains(nvml.OptionalSymbols, s) {
			continue
		}
		required = append(required, s)
		if !have[s] {
			missing = append(missing, s)
		}
	}
	t.Logf("Real NVML: %s", nv.describe(t))
	t.Logf("Checked %d NVML functions the agent calls without a look-up: %s", len(required), strings.Join(required, " "))
	g.Expect(missing).To(BeEmpty(),
		"the agent calls these NVML functions without looking them up (the fake library exports them), and driver %s lacks them: "+
			"on such a driver the agent aborts with \"symbol lookup error\" at the first call. Look each up before use "+
			"(monitors/nvml's OptionalSymbols and lookupSymbols), with a fallback, or stop calling it", nv.driver)
	t.Logf("Supported-driver floor holds for symbols: driver %s exports every NVML function the agent calls without a look-up", nv.driver)
}

// TestFakeMakesGoNVMLCallWhatTheRealLibraryGets checks the fake library's
// names against go-nvml's bindings: every function the fake exports is one
// go-nvml calls, and for each family of versioned functions (nvmlInit and
// nvmlInit_v2, nvmlDeviceGetPciInfo_v2 and _v3, …) go-nvml picks, at load
// time, the same version from the fake library as from the real one. So
// the tests that run against the fake exercise the entry points the agent
// calls on a real driver.
func TestFakeMakesGoNVMLCallWhatTheRealLibraryGets(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	nv := realLibrary(t)
	fake := fakeFunctions(t)
	have := nvmlFunctions(t, nv.path)
	src := goNVMLSource(t)

	called := map[string]bool{}
	for _, m := range regexp.MustCompile(`\bC\.(nvml\w+)\(`).FindAllStringSubmatch(src.bindings, -1) {
		called[m[1]] = true
	}
	var unreachable []string
	for _, s := range sortedKeys(fake) {
		if !called[s] {
			unreachable = append(unreachable, s)
		}
	}
	g.Expect(unreachable).To(BeEmpty(), "the fake library exports functions go-nvml never calls (a wrong version suffix?)")

	// updateVersionedSymbols looks the newer versions up in order and
	// calls the last one found, else the unversioned function.
	families := map[string][]string{}
	var order []string
	suffix := regexp.MustCompile(`_v[0-9]+$`)
	for _, m := range regexp.MustCompile(`(?m)^\s*err\s*:?=\s*l\.dl\.Lookup\("(\w+)"\)`).FindAllStringSubmatch(src.lib, -1) {
		base := suffix.ReplaceAllString(m[1], "")
		if _, ok := families[base]; !ok {
			order = append(order, base)
		}
		families[base] = append(families[base], m[1])
	}
	g.Expect(families).To(HaveKey("nvmlInit"), "no versioned look-ups found in go-nvml's updateVersionedSymbols (%s)", src.dir)
	resolve := func(lib map[string]bool, base string) string {
		got := base
		for _, v := range families[base] {
			if lib[v] {
				got = v
			}
		}
		return got
	}
	var checked []string
	for _, base := range order {
		if !fake[base] && !slices.ContainsFunc(families[base], func(v string) bool { return fake[v] }) {
			continue
		}
		onFake, onReal := resolve(fake, base), resolve(have, base)
		g.Expect(onFake).To(Equal(onReal), "go-nvml calls %s in the fake library but %s in driver %s", onFake, onReal, nv.driver)
		checked = append(checked, base+" → "+onReal)
	}
	t.Logf("go-nvml %s calls the same versioned functions in the fake library as in driver %s: %s", src.version, nv.driver, strings.Join(checked, ", "))
}

// goNVML is the source of go-nvml's pkg/nvml in the module cache.
type goNVML struct {
	dir, version string
	// bindings is nvml.go, the cgo wrappers (one C call each); lib is
	// lib.go, with updateVersionedSymbols.
	bindings, lib string
}

func goNVMLSource(t *testing.T) goNVML {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}} {{.Version}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		t.Fatalf("finding go-nvml's source: %v", err)
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		t.Fatalf("finding go-nvml's source: go list says %q", out)
	}
	src := goNVML{dir: filepath.Join(f[0], "pkg", "nvml"), version: f[1]}
	for name, dst := range map[string]*string{"nvml.go": &src.bindings, "lib.go": &src.lib} {
		b, err := os.ReadFile(filepath.Join(src.dir, name))
		if err != nil {
			t.Fatalf("reading go-nvml's source: %v", err)
		}
		*dst = string(b)
	}
	return src
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
