// Command kubectl-gpuhealth is gpuhealth's kubectl plugin: on PATH it runs
// as `kubectl gpuhealth`. It shows the fleet (status), one node's story in
// time order (story), the findings (findings), and writes the manual
// requests a human makes on a NodeHealth (release, recertify, hold,
// exclude, maintenance) and on a RemediationPolicy (reset-breaker), saying
// what each will change before it changes it.
package main

import (
	"os"

	"k8s.io/cli-runtime/pkg/genericiooptions"
)

func main() {
	os.Exit(execute(os.Args[1:], genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}))
}
