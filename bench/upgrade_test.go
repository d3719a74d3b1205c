package bench

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/prober"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/internal/testenv"
)

var (
	upgradeFrom       = flag.String("upgrade-from", "v1.36.3", "version BenchmarkUpgrade makes its clusters at")
	upgradeTo         = flag.String("upgrade-to", "v1.37.2", "version BenchmarkUpgrade upgrades them to")
	upgradeStrategies = flag.String("upgrade-strategies", "InPlace,Replace", "strategies BenchmarkUpgrade times, in order")
)

// BenchmarkUpgrade times the upgrade of a cluster of 3 control-plane
// machines with stacked etcd from -upgrade-from to -upgrade-to with each
// strategy, from the version change to UpgradeProgressing=False
// (UpgradeComplete), while a prober sends 30 requests a second (a write, a
// read and a list) through the cluster's endpoint, and prints them side by
// side with the failed requests (M11, M13). Target: InPlace under 120s with
// 0 failed requests.
//
//	go test -run '^$' -bench BenchmarkUpgrade -benchtime 1x -timeout 60m ./bench/
func BenchmarkUpgrade(b *testing.B) {
	ctx := context.Background()
	c, _ := startUp(b)
	type row struct {
		strategy string
		took     time.Duration
		res      prober.Result
	}
	var rows []row
	for i := 0; i < b.N; i++ {
		for _, strategy := range strings.Split(*upgradeStrategies, ",") {
			name := fmt.Sprintf("upgrade-%s-%d", strings.ToLower(strategy), i)
			took, res := timeUpgrade(b, ctx, c, name, clusterv1.ControlPlaneUpgradeStrategyType(strategy))
			fmt.Printf("%s %s → %s of 3 control-plane machines: %.1fs; prober %d requests (%.1f/s), %d failed\n",
				strategy, *upgradeFrom, *upgradeTo, took.Seconds(), res.Requests, res.Rate(), res.Failures)
			for _, e := range res.Errors {
				fmt.Printf("  failed: %s\n", e)
			}
			b.ReportMetric(took.Seconds(), "s-"+strategy)
			b.ReportMetric(float64(res.Failures), "failed-"+strategy)
			rows = append(rows, row{strategy, took, res})
		}
	}
	fmt.Printf("\n%-9s %10s %10s %8s\n", "STRATEGY", "WALL", "REQUESTS", "FAILED")
	for _, r := range rows {
		fmt.Printf("%-9s %9.1fs %10d %8d\n", r.strategy, r.took.Seconds(), r.res.Requests, r.res.Failures)
	}
}

func timeUpgrade(b *testing.B, ctx context.Context, c client.Client, name string, strategy clusterv1.ControlPlaneUpgradeStrategyType) (time.Duration, prober.Result) {
	cl := benchCluster(name, 3)
	cl.Spec.ControlPlane.Version = clusterv1.KubernetesVersion(*upgradeFrom)
	cl.Spec.ControlPlane.UpgradeStrategy.Type = strategy
	must(b, c.Create(ctx, cl))
	key := types.NamespacedName{Namespace: "default", Name: name}
	testenv.Eventually(b, 10*time.Minute, "the cluster Ready at "+*upgradeFrom, func() error {
		if err := c.Get(ctx, key, cl); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(cl.Status.Conditions, clusterv1.ReadyCondition) || cl.Status.ControlPlane.ReadyReplicas != 3 ||
			cl.Status.ControlPlane.Version != *upgradeFrom {
			return fmt.Errorf("not Ready at %s", *upgradeFrom)
		}
		return nil
	})

	secret := &corev1.Secret{}
	must(b, c.Get(ctx, types.NamespacedName{Namespace: "default", Name: remote.KubeconfigSecretName(name)}, secret))
	cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data[remote.KubeconfigSecretKey])
	must(b, err)
	cfg.QPS, cfg.Burst = 200, 400
	cs, err := kubernetes.NewForConfig(cfg)
	must(b, err)
	probe, err := prober.Start(ctx, cs, "default", 100*time.Millisecond)
	must(b, err)

	start := time.Now()
	patch := client.MergeFrom(cl.DeepCopy())
	cl.Spec.ControlPlane.Version = clusterv1.KubernetesVersion(*upgradeTo)
	must(b, c.Patch(ctx, cl, patch))
	testenv.Eventually(b, 20*time.Minute, "the upgrade complete", func() error {
		if err := c.Get(ctx, key, cl); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(cl.Status.Conditions, clusterv1.ClusterUpgradeProgressingCondition)
		if st := cl.Status.Upgrade; st == nil || st.To != *upgradeTo || st.CompletedAt == nil || cond == nil || cond.Reason != clusterv1.ClusterUpgradeCompleteReason {
			if cond != nil && cond.Reason == clusterv1.ClusterUpgradeStepTimeoutReason {
				b.Fatalf("the upgrade halted: %s", cond.Message)
			}
			return fmt.Errorf("not complete: %+v", cond)
		}
		return nil
	})
	took := time.Since(start)
	res := probe.Stop()

	must(b, c.Delete(ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}))
	testenv.Eventually(b, 5*time.Minute, "the cluster deleted", func() error {
		err := c.Get(ctx, key, &clusterv1.Cluster{})
		if err == nil {
			return fmt.Errorf("still there")
		}
		return client.IgnoreNotFound(err)
	})
	return took, res
}
