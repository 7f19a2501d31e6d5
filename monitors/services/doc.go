// Package services is the node agent's services source: it tells whether
// NVIDIA's host services (Fabric Manager, the persistence daemon, a
// host-managed IMEX daemon) run on the node, and whether they keep
// restarting, from the host's /proc, /usr/bin and PCI tree, without systemd's
// D-Bus API. It also reads which NVIDIA devices the PCI bus shows (ScanPCI)
// and the host package database's versions of Fabric Manager and IMEX
// (ParseDpkgStatus, Versions).
package services
