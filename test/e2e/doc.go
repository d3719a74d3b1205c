// Package e2e holds end-to-end suites: they build the marina binary, run it
// as a user would, and check the outcome with kubectl and the API.
package e2e
