package reproduce

import (
	"os"
	"strconv"
	"syscall"
)

// Nice is the scheduling priority the experiment runs at: the load generator, the pods, serve
// and the control plane (all children inherit it). On a machine shared with other work, a
// pod's sleep that ends late adds to the measured latency; a higher priority keeps that error
// smaller. The pods mostly sleep, so this takes little CPU from anyone else.
const Nice = -10

// raisePriority sets every thread of this process to Nice (threads made later inherit it from
// the thread that makes them). Without the permission it leaves the priority as it is.
func raisePriority() {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return
	}
	for _, t := range tasks {
		if tid, err := strconv.Atoi(t.Name()); err == nil {
			_ = syscall.Setpriority(syscall.PRIO_PROCESS, tid, Nice)
		}
	}
}
