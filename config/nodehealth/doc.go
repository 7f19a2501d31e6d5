// Package nodehealth holds no code: its tests apply the admission policy in
// this folder, which holds a manual request on a NodeHealth to the name of
// the user who writes it, to a real apiserver.
package nodehealth
