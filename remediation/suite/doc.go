// Package suite judges the output of certification and recertification
// steps: an exit code, the JSON report of DCGM's diagnostics (dcgmi diag -j),
// the text report of NVIDIA's nccl-tests or that of perftest's InfiniBand
// bandwidth tools (ib_write_bw, ib_read_bw, ib_send_bw). Judging is a pure
// function of the output, the Job's result and the node's labels, so every
// verdict is a table test.
package suite
