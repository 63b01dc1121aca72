// Command etcd is etcd's own server, built from the go.etcd.io/etcd/server/v3
// module for the real-control-plane test harness.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
