// Package job builds, creates, reads and cancels the Jobs gpuhealth runs on a
// node: recertification, GPU reset and node reboot.
package job
