// Package job builds, creates and reads the Jobs gpuhealth runs on a node:
// recertification, GPU reset and node reboot.
package job
