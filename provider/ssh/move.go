package ssh

import "marina.dev/marina/provider"

// Moving is what marina move must know of SSH machines (issue 36).
//
// The provider keeps which host each machine holds in the management
// plane's own state directory (Options.StateDir), which a move cannot
// carry: on the target the machines would read as vanished, and the
// source's orphan sweep would deprovision their hosts, the cluster's etcd
// data with them. Until the records move with the machines, a move of SSH
// machines is refused.
var Moving = provider.Moving{
	References: func(spec map[string]any) []provider.ObjectRef {
		var out []provider.ObjectRef
		for _, field := range []string{"hostsRef", "templatesRef"} {
			if ref, _ := spec[field].(map[string]any); ref != nil {
				if name, _ := ref["name"].(string); name != "" {
					out = append(out, provider.ObjectRef{Kind: "ConfigMap", Name: name})
				}
			}
		}
		return out
	},
	Refusal: "the SSH provider records which host each machine holds in the source plane's state directory, which a move cannot carry: " +
		"the target would find no machine and the source would deprovision the hosts as orphans. " +
		"Keep SSH clusters on the plane that made them",
}
