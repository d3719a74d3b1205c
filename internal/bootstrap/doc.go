// Package bootstrap decides what a control-plane machine runs: given a
// cluster's key material and one machine's facts, ControlPlane returns every
// file the machine needs (certificates, keys, kubeconfigs) and one
// manifest.Manifest per component (etcd when stacked, kube-apiserver,
// kube-controller-manager, kube-scheduler), and Bundle.Write puts them in the
// machine's sandbox, where the node agent's supervisor runs them.
//
// ControlPlane is a pure function of its input and a time: no client, no
// clock, no disk. It is what the control-plane controller calls for each
// machine, the same on every provider; certificates are issued freshly on
// each call, so the caller writes a bundle once and again only to renew or
// change it.
//
// The certificates are those kubeadm makes, with the differences explained
// where they are built. The sandbox holds only the key material its
// processes use: the cluster CA's key (kube-controller-manager signs
// kubelets' certificates with it) and the service-account key, but not the
// etcd or front-proxy CA keys, since marina issues every leaf certificate
// centrally.
package bootstrap
