// Package xid is the built-in, versioned catalog that maps an NVIDIA XID number to a severity and a recommended action.
package xid
