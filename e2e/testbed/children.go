package testbed

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Children lists this process's child processes still running (pid and command), so a test's
// TestMain can check that every server it started was stopped and reaped.
func Children() []string {
	var out []string
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	self := strconv.Itoa(os.Getpid())
	for _, f := range stats {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may contain spaces, so split after the last ')'.
		s := string(data)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		if fields := strings.Fields(s[i+1:]); len(fields) > 1 && fields[1] == self {
			out = append(out, strings.TrimSpace(s[:i+1]))
		}
	}
	return out
}
