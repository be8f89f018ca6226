// pause is the sandbox ("pause") image of the local node: containerd starts it
// as the first process of every Pod to hold the Pod's namespaces. It waits for
// SIGTERM or SIGINT and reaps orphaned children meanwhile, as the upstream
// pause binary does. Built static and packaged as localhost/sdcguard-pause.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
