// Package sandbox is the on-disk contract between the local provider, which
// builds one directory per machine, and the node agent that runs in it: the
// file names, the bootstrap document, and the agent lock whose holder is, by
// definition, the machine's running agent.
//
// It has no Kubernetes client in it, so that the provider can depend on it
// without the agent's code.
package sandbox
