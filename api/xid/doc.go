// Package xid is gpuhealth's XID catalog: NVIDIA's published XID catalog
// (generated into zz_generated.catalog.go by hack/xidgen) and the mapping of
// each of its resolution buckets, workflows and NVLink5 decode rows to a
// severity and a recommended action.
package xid

//go:generate go run ../../hack/xidgen -catalog ../../../shared/reference/nvidia-xid-catalog -out zz_generated.catalog.go
