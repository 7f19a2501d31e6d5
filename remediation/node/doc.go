// Package node applies and lifts quarantine on a Node — cordon, taint, the
// phase label and the GPUHealthy condition — idempotently, remembering on the
// Node itself what gpuhealth added so that nothing a human set is ever lifted.
package node
