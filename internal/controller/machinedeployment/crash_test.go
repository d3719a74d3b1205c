package machinedeployment

import (
	"context"
	"fmt"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/controller/machineset"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/internal/testenv/localenv"
)

// A deployment controller killed right after creating a set, or after
// scaling an old one, and started again, still ends with one set per
// revision and exactly replicas machines. (No machine controller runs; with
// maxUnavailable 3 of 3 the rollout needs no machine to become Ready.)
func TestControllerKilledDuringRolloutConverges(t *testing.T) {
	f := suite.NewFixture(t)
	md := newDeployment(f, "crashy", 3, 0, 3)
	create(t, md)
	settled := func(tier string) error {
		got := get(t, md.DeepCopy())
		machines := machinesIn(t, f.NS)
		if len(machines) != 3 || got.Status.ObservedGeneration != got.Generation {
			return fmt.Errorf("%d machines", len(machines))
		}
		for _, m := range machines {
			if m.Spec.Labels["tier"] != tier {
				return fmt.Errorf("machine %s has tier %s", m.Name, m.Spec.Labels["tier"])
			}
		}
		return nil
	}
	runUntilSettled := func(step, tier string) {
		t.Helper()
		crashes := 0
		defer func() {
			if crashes == 0 {
				t.Errorf("the controller never reached step %s", step)
			}
		}()
		for range 20 {
			crashed := make(chan struct{})
			once := false
			stop := startWith(f, Options{crashAt: func(s string) bool {
				if s != step || once {
					return false
				}
				once = true
				crashes++
				close(crashed)
				return true
			}})
			done := false
			testenv.Eventually(t, time.Minute, "a crash or a settled deployment", func() error {
				select {
				case <-crashed:
					return nil
				default:
				}
				if err := settled(tier); err != nil {
					return err
				}
				done = true
				return nil
			})
			stop()
			if done {
				return
			}
		}
		t.Fatal("still crashing after 20 restarts")
	}
	runUntilSettled("after-create-set", "v1")
	if sets := setsOf(t, md); len(sets) != 1 {
		t.Fatalf("%d sets for one revision", len(sets))
	}
	update(t, md, func(md *clusterv1.MachineDeployment) { md.Spec.Template.Spec.Labels["tier"] = "v2" })
	runUntilSettled("after-scale-old", "v2")
	if sets := setsOf(t, md); len(sets) != 2 {
		t.Fatalf("%d sets for two revisions", len(sets))
	}
}

// startWith runs the MachineSet and MachineDeployment controllers (no
// machine controller) until stop is called or the test ends.
func startWith(f *localenv.Fixture, opts Options) (stop func()) {
	return localenv.StartManager(f.T, mgmt.Config, f.NS, func(ctx context.Context, mgr ctrl.Manager) error {
		if _, err := machineset.SetupWithManager(mgr, machineset.Options{}); err != nil {
			return err
		}
		_, err := SetupWithManager(mgr, opts)
		return err
	})
}
