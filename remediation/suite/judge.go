package suite

import (
	"fmt"
	"strconv"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// DefaultProductLabel is the node label naming the GPU product (NVIDIA's GPU
// feature discovery sets it).
const DefaultProductLabel = "nvidia.com/gpu.product"

// Verdict is the judgement of one step.
type Verdict struct {
	// Passed is true when the step passed.
	Passed bool
	// Message says why, with the numbers.
	Message string
	// Measurements are the values the output reported.
	Measurements []gpuhealthv1alpha1.Measurement
}

// Judge judges a finished step. jobSucceeded and jobMessage are the Job's
// result; output is what its pod printed, or outputErr why it could not be
// read (nil for exit-code steps, which need no output); cut, when not
// empty, says the output is only the end of what was printed and names the
// limit (job.CutNote), and the verdict's message says so; labels are the
// node's, for the GPU product's threshold.
func Judge(p gpuhealthv1alpha1.ResultParser, jobSucceeded bool, jobMessage string, output []byte, cut string, outputErr error, labels map[string]string) Verdict {
	v := judge(p, jobSucceeded, jobMessage, output, outputErr, labels)
	if cut != "" && outputErr == nil && p.Type != "" && p.Type != gpuhealthv1alpha1.ParserExitCode {
		v.Message += " (" + cut + ")"
	}
	return v
}

func judge(p gpuhealthv1alpha1.ResultParser, jobSucceeded bool, jobMessage string, output []byte, outputErr error, labels map[string]string) Verdict {
	switch p.Type {
	case "", gpuhealthv1alpha1.ParserExitCode:
		if jobSucceeded {
			return Verdict{Passed: true, Message: "exited 0"}
		}
		return Verdict{Message: jobMessage}
	case gpuhealthv1alpha1.ParserDCGMDiag, gpuhealthv1alpha1.ParserNCCLTests, gpuhealthv1alpha1.ParserIBPerftest:
	default:
		return Verdict{Message: fmt.Sprintf("unknown parser %q", p.Type)}
	}
	if outputErr != nil {
		return Verdict{Message: fmt.Sprintf("%s; %v", jobMessage, outputErr)}
	}
	switch p.Type {
	case gpuhealthv1alpha1.ParserDCGMDiag:
		return judgeDCGM(output, jobSucceeded, jobMessage)
	case gpuhealthv1alpha1.ParserIBPerftest:
		return judgeIBPerftest(output, jobSucceeded, jobMessage, p.IBPerftest, labels)
	}
	return judgeNCCL(output, jobSucceeded, jobMessage, p.NCCL, labels)
}

// judgeDCGM passes a diagnostic report in which no test failed on any GPU,
// from a Job that succeeded.
func judgeDCGM(output []byte, jobSucceeded bool, jobMessage string) Verdict {
	r, err := ParseDCGMDiag(output)
	if err != nil {
		return Verdict{Message: fmt.Sprintf("%s; %v", jobMessage, err)}
	}
	v := Verdict{Measurements: []gpuhealthv1alpha1.Measurement{
		count("testsPassed", r.Passed), count("testsFailed", len(r.Failures)), count("testsSkipped", r.Skipped), count("testsWarned", r.Warned),
	}}
	switch {
	case len(r.Failures) > 0:
		v.Message = fmt.Sprintf("%d failed: %s", len(r.Failures), gpuhealthv1alpha1.FirstN(r.Failures, 3, "; "))
	case !jobSucceeded:
		v.Message = fmt.Sprintf("no test failed but dcgmi did not succeed (%s)", jobMessage)
	case r.Passed == 0:
		v.Message = "the report holds no passed test"
	default:
		v.Passed = true
		v.Message = fmt.Sprintf("%d passed, %d skipped, %d with warnings", r.Passed, r.Skipped, r.Warned)
		if r.Version != "" {
			v.Message += " (DCGM " + r.Version + ")"
		}
	}
	return v
}

// judgeNCCL passes a report without wrong results whose out-of-place bus
// bandwidth at its largest size reaches the node's product's threshold.
func judgeNCCL(output []byte, jobSucceeded bool, jobMessage string, th *gpuhealthv1alpha1.NCCLThresholds, labels map[string]string) Verdict {
	r, err := ParseNCCLTests(output)
	if err != nil {
		return Verdict{Message: fmt.Sprintf("%s; %v", jobMessage, err)}
	}
	last := r.Largest()
	v := Verdict{Measurements: []gpuhealthv1alpha1.Measurement{
		{Name: "busBandwidth", Value: decimal(last.BusBW), Unit: "GB/s"},
		{Name: "algBandwidth", Value: decimal(last.AlgBW), Unit: "GB/s"},
		{Name: "largestSize", Value: strconv.FormatInt(last.Size, 10), Unit: "B"},
	}}
	if r.AvgBusBW != nil {
		v.Measurements = append(v.Measurements, gpuhealthv1alpha1.Measurement{Name: "avgBusBandwidth", Value: decimal(*r.AvgBusBW), Unit: "GB/s"})
	}
	least, product, ok := threshold(th, labels)
	if ok {
		v.Measurements = append(v.Measurements, gpuhealthv1alpha1.Measurement{Name: "minBusBandwidth", Value: strconv.Itoa(int(least)), Unit: "GB/s"})
	}
	switch {
	case r.Wrong > 0:
		v.Message = fmt.Sprintf("%d wrong results (out of bounds values)", r.Wrong)
	case !jobSucceeded:
		v.Message = fmt.Sprintf("the test did not succeed (%s)", jobMessage)
	case !ok:
		v.Message = fmt.Sprintf("bus bandwidth %s GB/s at %d B, but no threshold for GPU product %q (set parser.nccl.products or defaultMinBusBandwidthGBps)", decimal(last.BusBW), last.Size, product)
	case last.BusBW < float64(least):
		v.Message = fmt.Sprintf("bus bandwidth %s GB/s at %d B is below the %d GB/s threshold for %s", decimal(last.BusBW), last.Size, least, productName(product))
	default:
		v.Passed = true
		v.Message = fmt.Sprintf("bus bandwidth %s GB/s at %d B reaches the %d GB/s threshold for %s", decimal(last.BusBW), last.Size, least, productName(product))
	}
	return v
}

// threshold is the least bus bandwidth for the node's GPU product.
func threshold(th *gpuhealthv1alpha1.NCCLThresholds, labels map[string]string) (int32, string, bool) {
	if th == nil {
		return 0, "", false
	}
	key := th.ProductLabel
	if key == "" {
		key = DefaultProductLabel
	}
	product := labels[key]
	for _, p := range th.Products {
		if p.Product == product {
			return p.MinBusBandwidthGBps, product, true
		}
	}
	if th.DefaultMinBusBandwidthGBps != nil {
		return *th.DefaultMinBusBandwidthGBps, product, true
	}
	return 0, product, false
}

// judgeIBPerftest passes a perftest report in which perftest printed no
// error, from a Job that succeeded, whose average bandwidth at its largest
// message size reaches the node's HCA model's threshold. Several rows at
// that size (a loopback pair's server and client, one run per HCA) are
// judged by the lowest.
func judgeIBPerftest(output []byte, jobSucceeded bool, jobMessage string, th *gpuhealthv1alpha1.IBPerftestThresholds, labels map[string]string) Verdict {
	r, err := ParseIBPerftest(output)
	if err != nil {
		return Verdict{Message: fmt.Sprintf("%s; %v", jobMessage, err)}
	}
	worst, n := r.Largest()
	v := Verdict{Measurements: []gpuhealthv1alpha1.Measurement{
		{Name: "bandwidth", Value: decimal(worst.AvgGbps), Unit: "Gb/s"},
		{Name: "peakBandwidth", Value: decimal(worst.PeakGbps), Unit: "Gb/s"},
		{Name: "largestSize", Value: strconv.FormatInt(worst.Bytes, 10), Unit: "B"},
	}}
	least, model, ok := ibThreshold(th, labels)
	if ok {
		v.Measurements = append(v.Measurements, gpuhealthv1alpha1.Measurement{Name: "minBandwidth", Value: strconv.Itoa(int(least)), Unit: "Gb/s"})
	}
	measured := fmt.Sprintf("bandwidth %s Gb/s at %d B", decimal(worst.AvgGbps), worst.Bytes)
	if worst.Device != "" {
		measured += " on " + worst.Device
	}
	if n > 1 {
		measured += fmt.Sprintf(" (the lowest of %d results at that size)", n)
	}
	switch {
	case r.ErrorCount > 0:
		shown := r.Errors[:min(2, len(r.Errors))]
		v.Message = fmt.Sprintf("perftest reported an error: %s (largest result: %s)", gpuhealthv1alpha1.JoinMore(shown, r.ErrorCount-len(shown), "; "), measured)
	case !jobSucceeded:
		v.Message = fmt.Sprintf("the test did not succeed (%s)", jobMessage)
	case !ok:
		v.Message = fmt.Sprintf("%s, but no threshold for HCA model %q (set parser.ibPerftest.models or defaultMinBandwidthGbps)", measured, model)
	case worst.AvgGbps < float64(least):
		v.Message = fmt.Sprintf("%s is below the %d Gb/s threshold for %s", measured, least, hcaModelName(model))
	default:
		v.Passed = true
		v.Message = fmt.Sprintf("%s reaches the %d Gb/s threshold for %s", measured, least, hcaModelName(model))
	}
	return v
}

// ibThreshold is the least bandwidth for the node's HCA model. Without a
// model label (there is no standard one) every node is unlabelled and gets
// the default.
func ibThreshold(th *gpuhealthv1alpha1.IBPerftestThresholds, labels map[string]string) (int32, string, bool) {
	if th == nil {
		return 0, "", false
	}
	model := ""
	if th.ModelLabel != "" {
		model = labels[th.ModelLabel]
	}
	for _, m := range th.Models {
		if m.Model == model && model != "" {
			return m.MinBandwidthGbps, model, true
		}
	}
	if th.DefaultMinBandwidthGbps != nil {
		return *th.DefaultMinBandwidthGbps, model, true
	}
	return 0, model, false
}

func hcaModelName(m string) string {
	if m == "" {
		return "an unlabelled HCA model"
	}
	return m
}

func productName(p string) string {
	if p == "" {
		return "an unlabelled GPU product"
	}
	return p
}

func count(name string, n int) gpuhealthv1alpha1.Measurement {
	return gpuhealthv1alpha1.Measurement{Name: name, Value: strconv.Itoa(n)}
}

func decimal(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
