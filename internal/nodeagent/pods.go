package nodeagent

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
)

// runPods watches the pods bound to the Node (one watch, filtered by the
// API server) and plays them: a bound pod is reported Running and Ready, a
// pod being deleted is confirmed gone. It returns when ctx ends.
func (a *agent) runPods(ctx context.Context) {
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{}, // unnamed: no metrics
	)
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	lw := cache.NewListWatchFromClient(a.cs.CoreV1().RESTClient(), "pods", metav1.NamespaceAll,
		fields.OneTermEqualSelector("spec.nodeName", a.boot.NodeName))
	store, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		Logger:        &a.log,
		ListerWatcher: lw,
		ObjectType:    &corev1.Pod{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    enqueue,
			UpdateFunc: func(_, obj any) { enqueue(obj) },
		},
		Transform: dropManagedFields,
	})

	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { informer.RunWithContext(ctx) })
	wg.Go(func() {
		<-ctx.Done()
		queue.ShutDown()
	})
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return
	}
	for a.nextPod(ctx, queue, store) {
	}
}

// dropManagedFields keeps the pod cache small: the agent never reads them.
func dropManagedFields(obj any) (any, error) {
	if pod, ok := obj.(*corev1.Pod); ok {
		pod.ManagedFields = nil
	}
	return obj, nil
}

// nextPod syncs one queued pod; it returns false once the queue shuts down.
func (a *agent) nextPod(ctx context.Context, queue workqueue.TypedRateLimitingInterface[string], store cache.Store) bool {
	key, quit := queue.Get()
	if quit {
		return false
	}
	defer queue.Done(key)
	obj, exists, err := store.GetByKey(key)
	if err != nil || !exists {
		queue.Forget(key)
		return true
	}
	if err := a.syncPod(ctx, obj.(*corev1.Pod)); err != nil {
		if ctx.Err() == nil {
			a.log.Error(err, "Syncing pod failed, retrying", "pod", key)
		}
		queue.AddRateLimited(key)
		return true
	}
	queue.Forget(key)
	return true
}

// syncPod moves one pod towards what a kubelet would make of it.
func (a *agent) syncPod(ctx context.Context, pod *corev1.Pod) error {
	pods := a.cs.CoreV1().Pods(pod.Namespace)
	switch {
	case pod.DeletionTimestamp != nil:
		// The simulated containers stop at once: confirm the termination,
		// as a kubelet does once its containers are gone. The UID
		// precondition spares a new pod of the same name.
		err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0),
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("confirming the termination of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		a.log.V(2).Info("Confirmed pod termination", "pod", podKey(pod))
		return nil
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return nil
	case a.podRunning(pod):
		return nil
	}
	upd := pod.DeepCopy()
	upd.Status = a.runningStatus(pod, metav1.Now())
	if _, err := pods.UpdateStatus(ctx, upd, metav1.UpdateOptions{FieldManager: fieldManager}); err != nil {
		return fmt.Errorf("reporting pod %s/%s running: %w", pod.Namespace, pod.Name, err)
	}
	a.log.V(2).Info("Pod running", "pod", podKey(pod))
	return nil
}

func podKey(pod *corev1.Pod) string { return pod.Namespace + "/" + pod.Name }

// runningConditions are the pod conditions a running, ready pod has.
var runningConditions = []corev1.PodConditionType{
	corev1.PodReadyToStartContainers,
	corev1.PodInitialized,
	corev1.PodScheduled,
	corev1.ContainersReady,
	corev1.PodReady,
}

// podRunning reports whether pod already shows what runningStatus writes.
func (a *agent) podRunning(pod *corev1.Pod) bool {
	st := &pod.Status
	if st.Phase != corev1.PodRunning || st.PodIP != a.boot.Address || st.StartTime == nil {
		return false
	}
	for _, t := range runningConditions {
		if c := podCondition(st, t); c == nil || c.Status != corev1.ConditionTrue {
			return false
		}
	}
	if len(st.ContainerStatuses) != len(pod.Spec.Containers) {
		return false
	}
	for _, cs := range st.ContainerStatuses {
		if !cs.Ready || cs.State.Running == nil {
			return false
		}
	}
	return true
}

// runningStatus is pod's status once its simulated containers run: init
// containers completed, every container running and ready, the pod on the
// node's address.
func (a *agent) runningStatus(pod *corev1.Pod, now metav1.Time) corev1.PodStatus {
	st := *pod.Status.DeepCopy()
	st.Phase = corev1.PodRunning
	st.Reason, st.Message = "", ""
	st.HostIP = a.boot.Address
	st.HostIPs = []corev1.HostIP{{IP: a.boot.Address}}
	st.PodIP = a.boot.Address
	st.PodIPs = []corev1.PodIP{{IP: a.boot.Address}}
	if st.StartTime == nil {
		st.StartTime = &now
	}
	for _, t := range runningConditions {
		setPodCondition(&st, t, now)
	}
	started := func(old []corev1.ContainerStatus, name string) metav1.Time {
		for _, s := range old {
			if s.Name == name && s.State.Running != nil {
				return s.State.Running.StartedAt
			}
		}
		return now
	}
	init := make([]corev1.ContainerStatus, 0, len(pod.Spec.InitContainers))
	for _, c := range pod.Spec.InitContainers {
		init = append(init, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, ContainerID: containerID(pod, c.Name),
			Ready: true, Started: ptr.To(false),
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now, ContainerID: containerID(pod, c.Name),
			}},
		})
	}
	st.InitContainerStatuses = init
	containers := make([]corev1.ContainerStatus, 0, len(pod.Spec.Containers))
	for _, c := range pod.Spec.Containers {
		containers = append(containers, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, ContainerID: containerID(pod, c.Name),
			Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started(pod.Status.ContainerStatuses, c.Name)}},
		})
	}
	st.ContainerStatuses = containers
	return st
}

func containerID(pod *corev1.Pod, name string) string {
	return fmt.Sprintf("simulated://%s/%s", pod.UID, name)
}

func podCondition(st *corev1.PodStatus, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range st.Conditions {
		if st.Conditions[i].Type == t {
			return &st.Conditions[i]
		}
	}
	return nil
}

// setPodCondition makes condition t True, moving its lastTransitionTime
// only if it was not True already.
func setPodCondition(st *corev1.PodStatus, t corev1.PodConditionType, now metav1.Time) {
	if c := podCondition(st, t); c != nil {
		if c.Status != corev1.ConditionTrue {
			c.Status, c.LastTransitionTime = corev1.ConditionTrue, now
		}
		c.Reason, c.Message = "", ""
		return
	}
	st.Conditions = append(st.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
}
