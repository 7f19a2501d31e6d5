package framework

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gpuhealth/gpuhealth/internal/test/recording"
)

// MetricsRecorder scrapes a /metrics endpoint every interval in its own
// goroutine and appends the samples of its gpuhealth_ families to a file as
// it goes, in internal/test/recording's format (`<unix-ms> <series> <value>` per
// sample, `<unix-ms> up 1|0` after each scrape), flushed after every
// scrape so the file is usable while the suite runs. hack/dashboard draws
// it. A scrape that fails (the process restarting) is recorded as `up 0`.
type MetricsRecorder struct {
	// Path is the recording file.
	Path string

	addr     string
	interval time.Duration
	client   *http.Client
	file     *os.File
	w        *recording.Writer
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
	// err is the first error writing the file; the goroutine sets it
	// before closing done.
	err error
}

// RecordMetrics creates path and starts recording the /metrics of addr
// (host:port) every interval, the first scrape at once.
func RecordMetrics(addr, path string, interval time.Duration) (*MetricsRecorder, error) {
	if interval <= 0 {
		return nil, fmt.Errorf("recording %s: interval %s is not positive", addr, interval)
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("recording %s: %w", addr, err)
	}
	r := &MetricsRecorder{
		Path: path, addr: addr, interval: interval,
		// A scrape that takes longer than the interval is a failed one.
		client: &http.Client{Timeout: interval},
		file:   f, w: recording.NewWriter(f),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	go r.loop()
	return r, nil
}

func (r *MetricsRecorder) loop() {
	defer close(r.done)
	tick := time.NewTicker(r.interval)
	defer tick.Stop()
	for {
		if err := r.scrapeOnce(time.Now()); err != nil {
			r.err = err
			return
		}
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
	}
}

// scrapeOnce records one scrape started at ts; only an error writing the
// file is returned (a failed scrape is data).
func (r *MetricsRecorder) scrapeOnce(ts time.Time) error {
	var samples []recording.Sample
	body, err := r.get()
	if err == nil {
		samples, err = recording.Parse(body)
	}
	if err != nil {
		err = r.w.WriteFailed(ts)
	} else {
		err = r.w.WriteScrape(ts, samples)
	}
	return errors.Join(err, r.w.Flush())
}

func (r *MetricsRecorder) get() ([]byte, error) {
	resp, err := r.client.Get("http://" + r.addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", r.addr, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// Stop ends the recording: it waits for the scrape under way, then flushes
// and closes the file. It returns the first error writing the file, and is
// safe to call more than once.
func (r *MetricsRecorder) Stop() error {
	r.once.Do(func() {
		close(r.stop)
		<-r.done
		r.err = errors.Join(r.err, r.w.Flush(), r.file.Close())
	})
	return r.err
}

// CopyTo copies the recording to path, creating its folder. Call it after
// Stop.
func (r *MetricsRecorder) CopyTo(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	src, err := os.Open(r.Path)
	if err != nil {
		return err
	}
	defer func() { _ = src.Close() }()
	dst, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		_ = dst.Close()
		return fmt.Errorf("copying %s to %s: %w", r.Path, path, err)
	}
	return dst.Close()
}
