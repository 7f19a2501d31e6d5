package job

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/iotest"

	"k8s.io/utils/ptr"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/suite"
)

func TestReadTailKeepsTheEnd(t *testing.T) {
	for _, tc := range []struct {
		name      string
		in        string
		keep, max int64
		want      string
		err       error
	}{
		{"shorter than kept", "abc", 8, 100, "abc", nil},
		{"exactly kept", "abcdefgh", 8, 100, "abcdefgh", nil},
		{"longer: its end", strings.Repeat("x", 50) + "the end!", 8, 100, "the end!", nil},
		{"many shifts", strings.Repeat("0123456789", 9) + "last", 4, 100, "last", nil},
		{"past what is read", strings.Repeat("y", 101), 8, 100, "", ErrOutputTooLong},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// One byte per read: the shifts happen at every boundary.
			got, total, err := readTail(iotest.OneByteReader(strings.NewReader(tc.in)), tc.keep, tc.max)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if tc.err == nil && (string(got) != tc.want || total != int64(len(tc.in))) {
				t.Errorf("readTail = %q, %d; want %q, %d", got, total, tc.want, len(tc.in))
			}
		})
	}
}

// A chatty nccl-tests run (NCCL_DEBUG=INFO) prints more than OutputLimit
// before its table. Its end is what is kept, so the table and the "Out of
// bounds" line are judged, and the verdict names the limit. (Reading its
// first 4 MiB, as the operator once did, failed it as "cut short".)
func TestChattyNCCLRunIsJudgedByItsEnd(t *testing.T) {
	var b bytes.Buffer
	for i := 0; b.Len() < OutputLimit+(1<<20); i++ {
		fmt.Fprintf(&b, "gpu-node-1:1234:1290 [%d] NCCL INFO Channel %02d/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n", i%8, i%32)
	}
	b.WriteString("#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong\n" +
		"  8589934592    2147483648     float     sum      -1  47550.0  180.65  338.72       0  47750.0  179.90  337.31       0\n" +
		"# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 338.0\n")
	text, total, err := readTail(bytes.NewReader(b.Bytes()), OutputLimit, OutputReadLimit)
	if err != nil {
		t.Fatal(err)
	}
	p := gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserNCCLTests, NCCL: &gpuhealthv1alpha1.NCCLThresholds{DefaultMinBusBandwidthGBps: ptr.To[int32](300)}}
	v := suite.Judge(p, true, "", text, CutNote(total), nil, nil)
	if !v.Passed || !strings.Contains(v.Message, "over the 4 MiB the operator keeps") {
		t.Errorf("verdict %+v; want passed, naming the 4 MiB limit", v)
	}
	head := b.Bytes()[:OutputLimit]
	if v := suite.Judge(p, true, "", head, "", nil, nil); v.Passed {
		t.Errorf("the first 4 MiB passed: %s", v.Message)
	}
}
