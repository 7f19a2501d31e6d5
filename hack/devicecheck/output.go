package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// The kinds of line on stdout.
const (
	kindReading = "reading"
	kindFinding = "finding"
	kindTiming  = "timing"
	kindSummary = "summary"
)

// readingLine is one check's values on one GPU at one poll (or the
// driver's, without a GPU).
type readingLine struct {
	Kind string    `json:"kind"`
	Time time.Time `json:"time"`
	// Poll is 0 for the reading at the start, then 1, 2, …
	Poll int `json:"poll"`
	// GPU is NVML's index; nil for the driver reading.
	GPU   *int   `json:"gpu,omitempty"`
	UUID  string `json:"uuid,omitempty"`
	Check string `json:"check"`
	// Values are the check's values (a struct per check, read.go); absent
	// when nothing could be read.
	Values any `json:"values,omitempty"`
	// Errors are the NVML calls that failed, by function (and argument),
	// with NVML's error string: "Not Supported" is normal where a GPU or
	// driver lacks the feature.
	Errors map[string]string `json:"errors,omitempty"`
}

// findingLine is one finding a source reported.
type findingLine struct {
	Kind      string                      `json:"kind"`
	Time      time.Time                   `json:"time"`
	Source    gpuhealthv1alpha1.Source    `json:"source"`
	Check     gpuhealthv1alpha1.Check     `json:"check"`
	Component gpuhealthv1alpha1.Component `json:"component"`
	Code      string                      `json:"code"`
	// Severity and Action are the source's; for an XID, which the sources
	// leave to the agent's pipeline, the XID catalog's (ClassifiedBy says
	// so).
	Severity     gpuhealthv1alpha1.Severity `json:"severity,omitempty"`
	Action       gpuhealthv1alpha1.Action   `json:"action,omitempty"`
	ClassifiedBy string                     `json:"classifiedBy,omitempty"`
	Message      string                     `json:"message,omitempty"`
	// Resolved: the source saw a condition end. It fails nothing.
	Resolved bool  `json:"resolved"`
	Count    int64 `json:"count,omitempty"`
}

// timingLine is how long one NVML function took over the run.
type timingLine struct {
	Kind string `json:"kind"`
	Call string `json:"call"`
	// Count is how many times it was called; Failed how many of those
	// returned anything but NVML_SUCCESS (Not Supported included).
	Count  int `json:"count"`
	Failed int `json:"failed"`
	// MinNs, MedianNs and MaxNs are in nanoseconds; the median of an even
	// count is the lower of the two middle values.
	MinNs    int64 `json:"minNs"`
	MedianNs int64 `json:"medianNs"`
	MaxNs    int64 `json:"maxNs"`
}

// summaryLine is the last line.
type summaryLine struct {
	Kind string `json:"kind"`
	// Result is pass, fail or nvml-unavailable.
	Result     string `json:"result"`
	ExitStatus int    `json:"exitStatus"`
	// Reasons say why the run failed.
	Reasons      []string  `json:"reasons,omitempty"`
	Started      time.Time `json:"started"`
	Duration     string    `json:"duration"`
	Elapsed      string    `json:"elapsed"`
	PollInterval string    `json:"pollInterval"`
	// Library is the libnvidia-ml.so.1 loaded; empty is the loader's.
	Library string `json:"library,omitempty"`
	// NVML is "ok" or why nvmlInit failed.
	NVML   string                            `json:"nvml"`
	Driver gpuhealthv1alpha1.DriverInventory `json:"driver"`
	GPUs   int                               `json:"gpus"`
	// Polls counts the rounds of readings, the one at the start included.
	Polls    int `json:"polls"`
	Readings int `json:"readings"`
	// ReadErrors counts the failed calls within readings.
	ReadErrors int `json:"readErrors"`
	// Findings counts the findings that were not resolutions;
	// ResolvedFindings the resolutions.
	Findings         int `json:"findings"`
	ResolvedFindings int `json:"resolvedFindings"`
	// NVMLSource and DCGM say how the sources ended: ran, off,
	// "not present: …" (DCGM only) or "failed: …".
	NVMLSource string `json:"nvmlSource"`
	DCGM       string `json:"dcgm"`
	// NVMLCalls counts this command's own NVML calls (the sources' are not
	// timed).
	NVMLCalls int `json:"nvmlCalls"`
}

// output writes JSON lines to stdout and the human account to stderr, from
// any goroutine.
type output struct {
	mu     sync.Mutex
	enc    *json.Encoder
	stderr io.Writer
	// err is the first write error on stdout.
	err error
}

func newOutput(stdout, stderr io.Writer) *output {
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	return &output{enc: enc, stderr: stderr}
}

// emit writes one JSON line.
func (o *output) emit(v any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.enc.Encode(v); err != nil && o.err == nil {
		o.err = err
	}
}

// say writes one human line to stderr.
func (o *output) say(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprintf(o.stderr, "devicecheck: "+format+"\n", args...)
}

// sayRaw writes text to stderr as it is.
func (o *output) sayRaw(text string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprint(o.stderr, text)
}
