package spool

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

func record(code string, sev gpuhealthv1alpha1.Severity, age time.Duration) *Record {
	seen := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC).Add(-age)
	return &Record{
		Spec: gpuhealthv1alpha1.NodeHealthEventSpec{
			NodeName: "node-1", Source: gpuhealthv1alpha1.SourceNVML, Check: gpuhealthv1alpha1.CheckXID,
			Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "GPU-1"},
			Code:      code, Severity: sev,
		},
		Base: -1, Pending: 1, FirstSeen: seen, LastSeen: seen,
	}
}

func TestPutAndReopen(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	s, recs, problems, err := Open(dir, 0)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(recs).To(BeEmpty())
	g.Expect(problems).To(BeEmpty())
	r := record("79", gpuhealthv1alpha1.SeverityFatal, 0)
	_, err = s.Put(r)
	g.Expect(err).NotTo(HaveOccurred())
	r.Pending = 5
	_, err = s.Put(r)
	g.Expect(err).NotTo(HaveOccurred())

	_, recs, _, err = Open(dir, 0)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(recs).To(HaveLen(1))
	g.Expect(recs[0].Pending).To(Equal(int64(5)))
	g.Expect(recs[0].Spec).To(Equal(r.Spec))

	g.Expect(s.Delete(r.Name())).To(Succeed())
	g.Expect(s.Delete(r.Name())).To(Succeed(), "deleting twice is fine")
	_, recs, _, _ = Open(dir, 0)
	g.Expect(recs).To(BeEmpty())
}

func TestCorruptRecordsAreMovedAsideNotLost(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	g.Expect(os.WriteFile(filepath.Join(dir, "garbage.json"), []byte("{not json"), 0o600)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(dir, "half.json.tmp"), []byte("{"), 0o600)).To(Succeed())
	_, recs, problems, err := Open(dir, 0)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(recs).To(BeEmpty())
	g.Expect(problems).To(HaveLen(1))
	g.Expect(filepath.Join(dir, "garbage.json.corrupt")).To(BeAnExistingFile())
	g.Expect(filepath.Join(dir, "half.json.tmp")).NotTo(BeAnExistingFile(), "an interrupted write is cleaned up")
}

func TestFullSpoolDropsOldestInfoFirstAndNeverFatal(t *testing.T) {
	tests := []struct {
		name        string
		held        []*Record
		put         *Record
		wantDropped []string
		wantErr     error
	}{
		{
			name:        "the oldest Info record makes room for a Fatal one",
			held:        []*Record{record("13", gpuhealthv1alpha1.SeverityInfo, time.Hour), record("31", gpuhealthv1alpha1.SeverityInfo, time.Minute), record("48", gpuhealthv1alpha1.SeverityDegraded, 2*time.Hour)},
			put:         record("79", gpuhealthv1alpha1.SeverityFatal, 0),
			wantDropped: []string{record("13", "", 0).Name()},
		},
		{
			name:        "an Info record is refused when everything held is more severe",
			held:        []*Record{record("48", gpuhealthv1alpha1.SeverityDegraded, time.Minute), record("62", gpuhealthv1alpha1.SeverityDegraded, time.Hour), record("79", gpuhealthv1alpha1.SeverityFatal, 2*time.Hour)},
			put:         record("13", gpuhealthv1alpha1.SeverityInfo, 0),
			wantErr:     ErrFull,
			wantDropped: nil,
		},
		{
			name:        "a Degraded record displaces an older Degraded one",
			held:        []*Record{record("48", gpuhealthv1alpha1.SeverityDegraded, time.Minute), record("62", gpuhealthv1alpha1.SeverityDegraded, time.Hour), record("79", gpuhealthv1alpha1.SeverityFatal, 2*time.Hour)},
			put:         record("74", gpuhealthv1alpha1.SeverityDegraded, 0),
			wantDropped: []string{record("62", "", 0).Name()},
		},
		{
			name:        "a Fatal record is kept past the bound when everything held is Fatal",
			held:        []*Record{record("79", gpuhealthv1alpha1.SeverityFatal, time.Minute), record("48", gpuhealthv1alpha1.SeverityFatal, time.Hour), record("62", gpuhealthv1alpha1.SeverityFatal, 2*time.Hour)},
			put:         record("95", gpuhealthv1alpha1.SeverityFatal, 0),
			wantDropped: nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			s, _, _, err := Open(t.TempDir(), 3)
			g.Expect(err).NotTo(HaveOccurred())
			for _, r := range tt.held {
				_, err := s.Put(r)
				g.Expect(err).NotTo(HaveOccurred())
			}
			dropped, err := s.Put(tt.put)
			if tt.wantErr != nil {
				g.Expect(err).To(MatchError(tt.wantErr))
				g.Expect(s.Len()).To(Equal(3))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(dropped).To(Equal(tt.wantDropped))
			g.Expect(s.Len()).To(Equal(3 + 1 - len(tt.wantDropped)))
		})
	}
}
