// Package nvml is the node agent's NVML source: XID critical errors from an
// NVML event set (event-driven, a blocking wait), lost GPUs, NVLink error
// counters judged as rates over a sliding window, NVLink link state, and the
// GPU fabric state and health summary, polled on an interval.
package nvml
