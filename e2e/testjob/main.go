// Command testjob is the container the real-node end-to-end tier runs as
// gpuhealth's reset, reboot and recertification Jobs and as a workload: it
// says what it is, optionally waits, and exits with the code it is told.
//
//	testjob [--sleep 3s] [--exit-code 0] [--serve] [name]
//
// --serve runs until SIGTERM (a workload pod) instead of exiting.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	sleep := flag.Duration("sleep", 0, "How long to wait before exiting.")
	code := flag.Int("exit-code", 0, "The exit code.")
	serve := flag.Bool("serve", false, "Run until SIGTERM or SIGINT, then exit 0.")
	flag.Parse()
	host, _ := os.Hostname()
	fmt.Printf("testjob %v in pod %s: sleep %s, exit code %d\n", flag.Args(), host, *sleep, *code)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	if *serve {
		s := <-sigs
		fmt.Printf("testjob: %s, exiting\n", s)
		return
	}
	select {
	case <-time.After(*sleep):
	case s := <-sigs:
		fmt.Printf("testjob: %s before the sleep ended\n", s)
	}
	fmt.Printf("testjob: exiting with %d\n", *code)
	os.Exit(*code)
}
