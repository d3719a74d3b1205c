// Package move hands a namespace's clusters from one management plane to
// another (marina move): it plans which objects go and in which order (a
// pure function of the source's objects), pauses the source, creates the
// copies paused on the target with their owner references rebuilt and
// their status copied, unpauses the target, and deletes the source's
// objects last without running their deletion. Every step is re-derived
// from the two API servers, so a move killed at any point finishes when
// it is run again.
package move
