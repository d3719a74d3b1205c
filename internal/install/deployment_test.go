package install

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"marina.dev/marina/internal/image"
)

// Issue 28: the controller marina init installs is production-shaped: it
// runs the image's non-root user on a read-only root without privileges,
// is probed on the manager's health endpoints, is sized, and keeps a
// replica through node loss and voluntary disruptions.
func TestTheControllerDeploymentIsHardened(t *testing.T) {
	objs, err := Objects(Options{Image: "registry.example/marina:v1", Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	d := &appsv1.Deployment{}
	convert(t, find(t, objs, "Deployment", "marina-controller"), d)
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]

	t.Run("runs the image's user, unprivileged, on a read-only root", func(t *testing.T) {
		if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
			t.Error("the pod does not require a non-root user")
		}
		if pod.SecurityContext == nil || pod.SecurityContext.SeccompProfile == nil || pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Error("the pod has no RuntimeDefault seccomp profile")
		}
		sc := c.SecurityContext
		if sc == nil {
			t.Fatal("the container has no security context")
		}
		if sc.RunAsUser == nil || *sc.RunAsUser != image.UID || sc.RunAsGroup == nil || *sc.RunAsGroup != image.GID {
			t.Errorf("runs as %v:%v, want the image's user %d:%d", sc.RunAsUser, sc.RunAsGroup, image.UID, image.GID)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Error("privilege escalation is allowed")
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Error("the root file system is writable")
		}
		if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
			t.Errorf("capabilities %+v, want every one dropped and none added", sc.Capabilities)
		}
		if len(c.Command) == 0 || c.Command[0] != image.BinaryPath {
			t.Errorf("command %q does not run the image's %s", c.Command, image.BinaryPath)
		}
		// What the controller writes must be a volume: the root is read-only.
		certDir := flagValue(c.Args, "--webhook-cert-dir")
		if certDir == "" || !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == certDir && !m.ReadOnly }) {
			t.Errorf("--webhook-cert-dir %q is not a writable volume: %+v", certDir, c.VolumeMounts)
		}
	})

	t.Run("probed on the manager's health endpoints", func(t *testing.T) {
		_, port, err := net.SplitHostPort(flagValue(c.Args, "--health-probe-bind-address"))
		if err != nil {
			t.Fatalf("--health-probe-bind-address: %v", err)
		}
		for name, probe := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
			if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != name {
				t.Errorf("no HTTP probe of %s: %+v", name, probe)
				continue
			}
			if got := containerPort(c, probe.HTTPGet.Port.String()); got != port {
				t.Errorf("the %s probe asks port %s (%q), the manager serves it on %s", name, got, probe.HTTPGet.Port.String(), port)
			}
		}
	})

	t.Run("sized", func(t *testing.T) {
		req, lim := c.Resources.Requests, c.Resources.Limits
		if req.Cpu().IsZero() || req.Memory().IsZero() || lim.Memory().IsZero() {
			t.Fatalf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
		}
		if lim.Memory().Cmp(*req.Memory()) < 0 {
			t.Errorf("memory limit %s below the request %s", lim.Memory(), req.Memory())
		}
		if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
			return e.Name == "GOMEMLIMIT" && e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory"
		}) {
			t.Error("GOMEMLIMIT does not follow the memory limit")
		}
	})

	podLabels := labels.Set(d.Spec.Template.Labels)
	t.Run("keeps a replica through node loss and disruptions", func(t *testing.T) {
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
			t.Errorf("replicas %v, want 2", d.Spec.Replicas)
		}
		spread := false
		if a := pod.Affinity; a != nil && a.PodAntiAffinity != nil {
			for _, term := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
				sel := term.PodAffinityTerm.LabelSelector
				if term.PodAffinityTerm.TopologyKey == corev1.LabelHostname && sel != nil && labels.SelectorFromSet(sel.MatchLabels).Matches(podLabels) {
					spread = true
				}
			}
		}
		if !spread {
			t.Errorf("no anti-affinity spreads the replicas over nodes: %+v", pod.Affinity)
		}
		pdb := &policyv1.PodDisruptionBudget{}
		convert(t, find(t, objs, "PodDisruptionBudget", "marina-controller"), pdb)
		if pdb.Namespace != d.Namespace || pdb.Spec.Selector == nil || !labels.SelectorFromSet(pdb.Spec.Selector.MatchLabels).Matches(podLabels) {
			t.Errorf("the PodDisruptionBudget %s/%s does not select the controller's pods", pdb.Namespace, pdb.Name)
		}
		if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.MinAvailable != nil {
			t.Errorf("budget %+v, want maxUnavailable 1 (minAvailable would block drains of a single replica)", pdb.Spec)
		}
	})

	t.Run("the webhook Service sends to ready replicas", func(t *testing.T) {
		svc := &corev1.Service{}
		convert(t, find(t, objs, "Service", "marina-webhook"), svc)
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
			t.Errorf("the Service selects %v, not the controller's pods %v", svc.Spec.Selector, podLabels)
		}
		if svc.Spec.PublishNotReadyAddresses {
			t.Error("the Service publishes replicas that are not ready")
		}
		if len(svc.Spec.Ports) != 1 || containerPort(c, svc.Spec.Ports[0].TargetPort.String()) == "" {
			t.Errorf("the Service's target port %v is no container port", svc.Spec.Ports)
		}
	})

	t.Run("a server-side dry run accepts it", func(t *testing.T) {
		ctx := context.Background()
		// A dry run makes nothing, so the namespaced objects go to a
		// namespace that exists; marina init's own is left to the tests
		// that install for real.
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "dry-run"}}
		if err := env.Client.Create(ctx, ns); err != nil {
			t.Fatal(err)
		}
		for _, obj := range objs {
			obj = obj.DeepCopy()
			if obj.GetKind() == "Namespace" {
				continue
			}
			if obj.GetNamespace() == Namespace {
				obj.SetNamespace(ns.Name)
			}
			if err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner(FieldOwner), client.ForceOwnership, client.DryRunAll); err != nil {
				t.Errorf("server-side dry run of %s %s: %v", obj.GetKind(), obj.GetName(), err)
			}
		}
	})
}

func TestObjectsWithAWebhookURLInstallNoDisruptionBudget(t *testing.T) {
	objs, err := Objects(Options{WebhookURL: "https://10.0.0.5:9443"})
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range objs {
		if obj.GetKind() == "PodDisruptionBudget" {
			t.Errorf("PodDisruptionBudget %s installed with no Deployment to guard", obj.GetName())
		}
	}
}

func convert(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// flagValue is the value of --name=value among args.
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// containerPort resolves a port name or number to the container's port
// number, "" when the container has no such port.
func containerPort(c corev1.Container, port string) string {
	for _, p := range c.Ports {
		if p.Name == port || strconv.Itoa(int(p.ContainerPort)) == port {
			return strconv.Itoa(int(p.ContainerPort))
		}
	}
	return ""
}
