//go:build !cgo

package dcgm

import (
	"context"

	"github.com/gpuhealth/gpuhealth/monitors"
)

// Connect is the default NewClientFunc. go-dcgm needs cgo; this build has
// none, so DCGM is unavailable.
func Connect(context.Context, ClientConfig) (Client, error) {
	return nil, monitors.Unavailable("the agent was built without cgo, which go-dcgm needs to load libdcgm.so.4")
}
