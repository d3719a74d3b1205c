// Package components runs a local control-plane machine's components (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler) the way a kubelet
// runs static pods: each component's desired state is one manifest file in
// the machine's sandbox, and a Supervisor keeps one child process per
// manifest running, restarts it with exponential backoff when it exits,
// restarts just that component when its manifest changes, and writes what
// actually runs to one status file per component.
//
// Layout, under the sandbox directory:
//
//	manifests/<component>.json  a manifest.Manifest, written by marina (manifest.Write)
//	logs/<component>.log        the component's output (0600)
//	status/<component>.json     a Status, written by the Supervisor
//
// The Supervisor polls the manifests directory every second: a handful of
// small files, compared by content, so the loop is level-based and needs no
// inotify bookkeeping (watches lost on directory replacement, queue
// overflows, atomic renames seen as several events); a second of latency is
// nothing beside a component's start-up.
//
// Children are started through package process, so none outlives the agent,
// even when it is killed with SIGKILL. Arguments are never logged: they may
// name keys and tokens; the log names the component, its version and PID.
package components
