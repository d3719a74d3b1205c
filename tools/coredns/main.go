// Command coredns is CoreDNS built from its published Go module at the
// version pinned in tools/versions.env, with the plugins marina's Corefile
// uses (internal/addons) and no others.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// The plugins run in this order whatever the Corefile's, as in CoreDNS.
func init() {
	dnsserver.Directives = []string{"reload", "ready", "health", "prometheus", "errors", "log", "loadbalance", "cache", "kubernetes"}
}

func main() { coremain.Run() }
