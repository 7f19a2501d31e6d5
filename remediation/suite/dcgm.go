package suite

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// DCGMReport is what `dcgmi diag -r <level> -j` reported.
type DCGMReport struct {
	// Version is the DCGM version the report names.
	Version string
	// Passed, Skipped and Warned count results (one per test and GPU).
	Passed, Skipped, Warned int
	// Failures describe each failed result: test, GPU and DCGM's words.
	Failures []string
}

// dcgmRoots are the keys DCGM puts its diagnostic under.
var dcgmRoots = []string{"DCGM GPU Diagnostic", "DCGM Diagnostic"}

// ParseDCGMDiag reads the JSON report `dcgmi diag -r <level> -j` prints:
// test_categories[].tests[].results[] with a status per test (and GPU),
// under "DCGM GPU Diagnostic" (DCGM 3) or "DCGM Diagnostic" (DCGM 4). Text
// before the JSON object (a wrapper's or nv-hostengine's lines) is skipped.
// A report that holds no test is an error; a runtime error the report
// names is a failure.
func ParseDCGMDiag(out []byte) (*DCGMReport, error) {
	start := bytes.IndexByte(out, '{')
	if start < 0 {
		return nil, errors.New("not a dcgmi diag JSON report: no JSON object in the output")
	}
	var root map[string]any
	dec := json.NewDecoder(bytes.NewReader(out[start:]))
	dec.UseNumber()
	if err := dec.Decode(&root); err != nil {
		return nil, fmt.Errorf("not a dcgmi diag JSON report: %w", err)
	}
	r := &DCGMReport{}
	tests := 0
	// --iterations N prints {"iterations": [report, …], "Overall Result": …}.
	reports := []map[string]any{root}
	if its, ok := root["iterations"].([]any); ok {
		reports = reports[:0]
		for _, it := range its {
			if m, ok := it.(map[string]any); ok {
				reports = append(reports, m)
			}
		}
	}
	for _, rep := range reports {
		tests += r.report(rep)
	}
	if s, _ := root["Overall Result"].(string); strings.EqualFold(s, "fail") && len(r.Failures) == 0 {
		r.Failures = append(r.Failures, "the overall result failed")
	}
	if tests == 0 && len(r.Failures) == 0 {
		return nil, errors.New("not a dcgmi diag JSON report: no test_categories with tests")
	}
	return r, nil
}

// report counts one report's tests and returns how many it holds.
func (r *DCGMReport) report(root map[string]any) int {
	diag := root
	for _, k := range dcgmRoots {
		if m, ok := root[k].(map[string]any); ok {
			diag = m
			break
		}
	}
	meta, _ := root["metadata"].(map[string]any)
	if v := str("version", diag, root, meta); v != "" {
		r.Version = v
	}
	if e := str("runtime_error", diag, root); e != "" {
		r.Failures = append(r.Failures, "runtime error: "+e)
	}
	cats, _ := diag["test_categories"].([]any)
	tests := 0
	for _, c := range cats {
		cat, _ := c.(map[string]any)
		list, _ := cat["tests"].([]any)
		for _, t := range list {
			test, ok := t.(map[string]any)
			if !ok {
				continue
			}
			tests++
			r.test(test)
		}
	}
	return tests
}

// test counts one test's results.
func (r *DCGMReport) test(test map[string]any) {
	name, _ := test["name"].(string)
	results, _ := test["results"].([]any)
	failed := false
	for _, x := range results {
		res, ok := x.(map[string]any)
		if !ok {
			continue
		}
		status, _ := res["status"].(string)
		switch strings.ToLower(strings.TrimSpace(status)) {
		case "pass":
			r.Passed++
		case "skip", "skipped", "not run", "notrun", "not_run":
			r.Skipped++
		case "warn", "warning":
			r.Warned++
		default:
			failed = true
			what := name
			if id := entity(res); id != "" {
				what += " on GPU " + id
			}
			if !strings.EqualFold(status, "fail") {
				what += fmt.Sprintf(" (status %q)", status)
			}
			if msg := words(res); msg != "" {
				what += ": " + msg
			}
			r.Failures = append(r.Failures, what)
		}
	}
	if sum, ok := test["test_summary"].(map[string]any); ok && !failed {
		if s, _ := sum["status"].(string); strings.EqualFold(s, "fail") {
			r.Failures = append(r.Failures, name+": the test's summary failed")
		}
	}
}

// entity names the GPU (or other entity) a result is about.
func entity(res map[string]any) string {
	for _, k := range []string{"gpu_ids", "gpu_id", "entity_id"} {
		switch v := res[k].(type) {
		case string:
			return v
		case json.Number:
			return v.String()
		}
	}
	return ""
}

// words collects what a result says: its warnings (a string, or objects
// with "warning" or "message") and info.
func words(res map[string]any) string {
	var out []string
	for _, k := range []string{"warnings", "errors", "info"} {
		switch v := res[k].(type) {
		case string:
			out = append(out, v)
		case []any:
			for _, w := range v {
				switch w := w.(type) {
				case string:
					out = append(out, w)
				case map[string]any:
					for _, f := range []string{"warning", "message", "error"} {
						if s, ok := w[f].(string); ok && s != "" {
							out = append(out, s)
							break
						}
					}
				}
			}
		}
	}
	return strings.Join(out, "; ")
}

// str is the first non-empty string under key in ms.
func str(key string, ms ...map[string]any) string {
	for _, m := range ms {
		if s, ok := m[key].(string); ok && s != "" {
			return s
		}
	}
	return ""
}
