package testenv

import (
	"sync"
	"testing"
)

// Tests that run side by side each get ports of their own (issue 34): 40
// concurrent callers asking for 4 ports each never share one, and every
// port is below the kernel's ephemeral range.
func TestFreePortsNeverHandsOutAPortTwice(t *testing.T) {
	const callers, n = 40, 4
	bases := make([]int, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bases[i] = FreePorts(t, n)
		}()
	}
	wg.Wait()
	owner := map[int]int{}
	for i, base := range bases {
		for p := base; p < base+n; p++ {
			if p < firstTestPort || p > lastTestPort {
				t.Errorf("caller %d got port %d, outside %d-%d", i, p, firstTestPort, lastTestPort)
			}
			if j, ok := owner[p]; ok {
				t.Errorf("port %d handed to callers %d and %d", p, j, i)
			}
			owner[p] = i
		}
	}
}
