// Command etcd is etcd's own server, built from its published Go module at
// the version pinned in tools/versions.env.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
