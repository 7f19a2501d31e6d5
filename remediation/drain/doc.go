// Package drain empties one node at a time through the Eviction API, in short bounded passes shared by many node reconcilers.
package drain
