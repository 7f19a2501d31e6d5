package main

import (
	"fmt"
	"slices"
	"strings"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors/nvml"
)

// describeDriver is the human line for the driver reading.
func describeDriver(v driverValues) string {
	var missing []string
	for _, name := range nvml.OptionalSymbols {
		if !v.OptionalSymbols[name] {
			missing = append(missing, name)
		}
	}
	optional := "every optional NVML function present"
	if len(missing) > 0 {
		optional = "without " + strings.Join(missing, ", ") + " (the agent falls back or goes without)"
	}
	return fmt.Sprintf("driver %s, CUDA %s, NVML %s; %s; %s",
		orDash(v.Version), orDash(v.CUDAVersion), orDash(v.NVMLVersion), plural(v.GPUs, "GPU", "GPUs"), optional)
}

// describeGPU is the human account of one GPU's first readings: a header
// with the inventory, then one line of what the checks read.
func describeGPU(d *device, lines []readingLine) string {
	header := fmt.Sprintf("GPU %d %s PCI %s", d.index, d.uuid, orDash(d.pciBus))
	var parts, unread []string
	for _, l := range lines {
		if l.Values == nil {
			unread = append(unread, fmt.Sprintf("%s (%s)", l.Check, firstError(l.Errors)))
			continue
		}
		switch v := l.Values.(type) {
		case gpuhealthv1alpha1.GPUInventory:
			header += fmt.Sprintf(": %s, VBIOS %s, InfoROM %s, ECC %s, persistence %s, MIG %s, power limit %d W",
				orDash(v.Product), orDash(v.VBIOS), orDash(v.InfoROM), orDash(v.ECC), orDash(v.Persistence), orDash(v.MIG), v.PowerLimitWatts)
		case fabricValues:
			s := "fabric " + v.State
			if v.HealthSummary != "" {
				s += "/" + v.HealthSummary
			}
			parts = append(parts, fmt.Sprintf("%s (status %s, clique %d)", s, v.Status, v.CliqueID))
		case nvlinkValues:
			parts = append(parts, describeLinks(v))
		case nvlinkErrorValues:
			parts = append(parts, describeLinkErrors(v))
		case clocksValues:
			s := "clocks"
			if v.Reasons != nil {
				s += " " + strings.Join(orNone(v.ReasonNames), ",")
			}
			if v.SMMHz != nil && v.SMMaxMHz != nil {
				s += fmt.Sprintf(", SM %d of %d MHz", *v.SMMHz, *v.SMMaxMHz)
			}
			parts = append(parts, s)
		case pcieValues:
			parts = append(parts, fmt.Sprintf("PCIe gen %s of %s, x%s of x%s", num(v.Generation), num(v.MaxGeneration), num(v.Width), num(v.MaxWidth)))
		case pcieReplayValues:
			parts = append(parts, plural(v.Count, "PCIe replay", "PCIe replays"))
		case remapValues:
			parts = append(parts, fmt.Sprintf("rows remapped %d correctable, %d uncorrectable, pending %t, failed %t", v.Correctable, v.Uncorrectable, v.Pending, v.Failed))
		case retiredValues:
			parts = append(parts, fmt.Sprintf("retired pages pending %t", v.Pending))
		case eccValues:
			parts = append(parts, fmt.Sprintf("%d volatile uncorrected ECC", v.VolatileUncorrected))
		case temperatureValues:
			parts = append(parts, fmt.Sprintf("%s °C (slowdown %s °C)", num(v.GPUC), num(v.SlowdownC)))
		case utilizationValues:
			parts = append(parts, fmt.Sprintf("utilisation %d%% GPU, %d%% memory", v.GPUPercent, v.MemoryPercent))
		}
	}
	out := header + "\n    " + strings.Join(parts, "; ")
	if len(unread) > 0 {
		out += "\n    not read: " + strings.Join(unread, ", ")
	}
	return out
}

func describeLinks(v nvlinkValues) string {
	if len(v.Links) == 0 {
		return "no NVLink"
	}
	s := fmt.Sprintf("NVLink %d of %d up", v.Up, len(v.Links))
	var speeds []uint64
	for _, l := range v.Links {
		if l.SpeedMBps != nil {
			speeds = append(speeds, *l.SpeedMBps)
		}
	}
	if len(speeds) > 0 {
		lo, hi := slices.Min(speeds), slices.Max(speeds)
		if lo == hi {
			s += fmt.Sprintf(" at %d MB/s", lo)
		} else {
			s += fmt.Sprintf(" at %d to %d MB/s", lo, hi)
		}
	}
	return s
}

func describeLinkErrors(v nvlinkErrorValues) string {
	if len(v.Links) == 0 {
		return "no NVLink error counters"
	}
	total := map[nvml.Counter]uint64{}
	for _, l := range v.Links {
		for k, n := range l.Counters {
			total[k] += n
		}
	}
	var parts []string
	for _, k := range nvlinkCounters {
		if total[k.name] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k.name, total[k.name]))
		}
	}
	if len(parts) == 0 {
		return "NVLink error counters all 0"
	}
	return "NVLink errors (all links) " + strings.Join(parts, ", ")
}

// firstError is the first of a reading's errors, by function name.
func firstError(errs map[string]string) string {
	keys := make([]string, 0, len(errs))
	for k := range errs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if len(keys) == 0 {
		return "no value"
	}
	return keys[0] + ": " + errs[keys[0]]
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func orNone(names []string) []string {
	if len(names) == 0 {
		return []string{"none"}
	}
	return names
}

// num writes a value that may not have been read.
func num[T ~int | ~uint32](v *T) string {
	if v == nil {
		return "?"
	}
	return fmt.Sprint(*v)
}
