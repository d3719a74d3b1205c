package remote

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/kubeconfig"
)

// KubeconfigSecretKey is the key of the kubeconfig in a cluster's Secret.
const KubeconfigSecretKey = "value"

// NodeProviderIDIndex indexes cached Nodes by spec.providerID.
const NodeProviderIDIndex = "spec.providerID"

// KubeconfigSecretName is the name of a cluster's admin kubeconfig Secret.
func KubeconfigSecretName(cluster string) string { return cluster + "-kubeconfig" }

// CachedSecrets selects the Secrets marina's caches hold: those labelled
// clusterv1.ClusterNameLabel, which every Secret marina makes for a cluster
// carries and a user's kubeconfig Secret for a cluster someone else runs
// must carry (issue 24, finding 6: no tenant's Secret in marina's memory).
func CachedSecrets() (labels.Selector, error) {
	labelled, err := labels.NewRequirement(clusterv1.ClusterNameLabel, selection.Exists, nil)
	if err != nil {
		return nil, fmt.Errorf("selecting the Secrets marina caches: %w", err)
	}
	return labels.NewSelector().Add(*labelled), nil
}

// ErrKubeconfigMissing says the cluster's kubeconfig Secret does not exist yet.
var ErrKubeconfigMissing = errors.New("the cluster's kubeconfig Secret does not exist yet")

// ErrKubeconfigUnlabelled says the cluster's kubeconfig Secret exists but
// lacks the label clusterv1.ClusterNameLabel, without which marina's cache
// does not hold it. Errors that wrap it wrap ErrKubeconfigMissing too.
var ErrKubeconfigUnlabelled = errors.New("the cluster's kubeconfig Secret lacks marina's label")

// ErrKubeconfigRefused says the cluster's kubeconfig Secret holds a field
// that would read a file of the management host or run a program there
// (an exec plugin, an auth-provider, a tokenFile, a key file path); the
// error names each. Fixing the Secret is an event of the cached Secrets.
var ErrKubeconfigRefused = kubeconfig.ErrNotInline

// Cluster is access to one workload cluster.
type Cluster struct {
	// Config reaches the cluster's API server as its administrator.
	Config *rest.Config
	// Client is a direct client for writes and uncached reads.
	Client client.Client
	// Clientset is a typed clientset (eviction, token requests).
	Clientset kubernetes.Interface
	// Nodes is a cache of the cluster's Nodes, indexed by NodeProviderIDIndex.
	Nodes client.Reader
	// csrs caches the kubelet client certificate requests when
	// Options.OnCSREvent is set and marina may answer them; nil otherwise,
	// with csrErr saying why when it was asked for.
	csrs   client.Reader
	csrErr error

	secretVersion string
	stop          context.CancelFunc
	lastUsed      time.Time
	lastHealthy   time.Time
}

// CSREvent tells that a kubelet client certificate request of a cluster
// changed.
type CSREvent struct {
	Cluster types.NamespacedName
	CSR     *certificatesv1.CertificateSigningRequest
}

// CSRUsernameIndex indexes cached certificate requests by spec.username.
const CSRUsernameIndex = "spec.username"

// NodeEvent tells that a Node of a cluster changed.
type NodeEvent struct {
	Cluster types.NamespacedName
	Node    *corev1.Node
}

// Options configure a Cache.
type Options struct {
	// MaxClusters bounds how many clusters are kept; the least recently used
	// one is dropped when a new one would exceed it.
	MaxClusters int
	// SyncTimeout bounds the wait for a new cluster's Node cache.
	SyncTimeout time.Duration
	// OnNodeEvent is called (from informer goroutines) when a Node changes.
	OnNodeEvent func(NodeEvent)
	// OnCSREvent, when set, makes the cache also hold each cluster's
	// requests for kubelet client certificates (signer
	// kubernetes.io/kube-apiserver-client-kubelet, indexed by
	// CSRUsernameIndex) and is called when one changes.
	OnCSREvent func(CSREvent)
	// HealthInterval is how often a cached cluster's API server is probed
	// (/readyz) before it is handed out again; a cluster that does not
	// answer is dropped, so its stale Node cache is never trusted.
	HealthInterval time.Duration
	// Live reads a kubeconfig Secret the cache does not hold, uncached,
	// only to tell a missing Secret from one without the label marina
	// caches Secrets by (clusterv1.ClusterNameLabel). Nil: not told apart.
	Live client.Reader
}

// Cache holds one Cluster per workload cluster.
type Cache struct {
	mgmt   client.Reader
	scheme *runtime.Scheme
	opts   Options

	mu       sync.Mutex
	clusters map[types.NamespacedName]*Cluster
	building map[types.NamespacedName]*sync.Mutex
	// failed remembers a cluster that could not be reached, so that its
	// other machines fail fast instead of each waiting out SyncTimeout.
	failed map[types.NamespacedName]failure
}

type failure struct {
	at            time.Time
	secretVersion string
	err           error
}

// NewCache builds a Cache that reads kubeconfig Secrets through mgmt.
func NewCache(mgmt client.Reader, scheme *runtime.Scheme, opts Options) *Cache {
	if opts.MaxClusters <= 0 {
		opts.MaxClusters = 100
	}
	if opts.SyncTimeout <= 0 {
		opts.SyncTimeout = 30 * time.Second
	}
	if opts.HealthInterval <= 0 {
		opts.HealthInterval = 30 * time.Second
	}
	return &Cache{mgmt: mgmt, scheme: scheme, opts: opts, clusters: map[types.NamespacedName]*Cluster{},
		building: map[types.NamespacedName]*sync.Mutex{},
		failed:   map[types.NamespacedName]failure{}}
}

// Get returns access to the cluster, building it on first use and rebuilding
// it when the kubeconfig Secret changed. It returns ErrKubeconfigMissing
// (wrapped) when the Secret does not exist.
func (c *Cache) Get(ctx context.Context, cluster types.NamespacedName) (*Cluster, error) {
	secret := &corev1.Secret{}
	key := types.NamespacedName{Namespace: cluster.Namespace, Name: KubeconfigSecretName(cluster.Name)}
	if err := c.mgmt.Get(ctx, key, secret); err != nil {
		if apierrors.IsNotFound(err) {
			c.Forget(cluster) // its informers would watch a cluster nobody may reach
			return nil, c.missing(ctx, cluster, key)
		}
		return nil, fmt.Errorf("reading kubeconfig Secret %s: %w", key, err)
	}

	if cl := c.current(cluster, secret.ResourceVersion); cl != nil {
		if err := c.checkHealth(ctx, cluster, cl); err != nil {
			return nil, err
		}
		return cl, nil
	}
	// One build per cluster at a time, and none under c.mu: a cluster that
	// does not answer must not hold up machines of the others.
	building := c.buildLock(cluster)
	building.Lock()
	defer building.Unlock()
	if cl := c.current(cluster, secret.ResourceVersion); cl != nil {
		return cl, nil
	}
	if err := c.recentFailure(cluster, secret.ResourceVersion); err != nil {
		return nil, err
	}
	cl, err := c.build(ctx, cluster, secret)
	if err != nil {
		c.mu.Lock()
		c.failed[cluster] = failure{at: time.Now(), secretVersion: secret.ResourceVersion, err: err}
		c.mu.Unlock()
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.failed, cluster)
	if old, ok := c.clusters[cluster]; ok {
		old.stop()
	}
	c.evictLocked()
	c.clusters[cluster] = cl
	return cl, nil
}

// missing explains a kubeconfig Secret the manager's cache does not hold:
// it does not exist, or it lacks the label marina caches Secrets by (a
// Secret a user made for a cluster someone else runs). Both wrap
// ErrKubeconfigMissing: adding the Secret or its label is an event of the
// cached Secrets, which brings the machines back.
func (c *Cache) missing(ctx context.Context, cluster, key types.NamespacedName) error {
	if c.opts.Live != nil {
		meta := &metav1.PartialObjectMetadata{}
		meta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
		if err := c.opts.Live.Get(ctx, key, meta); err == nil {
			if _, ok := meta.Labels[clusterv1.ClusterNameLabel]; !ok {
				return &unlabelledError{cluster: cluster, secret: key}
			}
		}
	}
	return fmt.Errorf("cluster %s: %w", cluster, ErrKubeconfigMissing)
}

// unlabelledError is ErrKubeconfigUnlabelled (and ErrKubeconfigMissing)
// for one cluster, saying what to do.
type unlabelledError struct{ cluster, secret types.NamespacedName }

func (e *unlabelledError) Error() string {
	return fmt.Sprintf("cluster %s: %v: marina reads only Secrets labelled %s; label Secret %s with %s=%s",
		e.cluster, ErrKubeconfigUnlabelled, clusterv1.ClusterNameLabel, e.secret, clusterv1.ClusterNameLabel, e.cluster.Name)
}

func (e *unlabelledError) Is(target error) bool {
	return target == ErrKubeconfigUnlabelled || target == ErrKubeconfigMissing
}

// checkHealth probes the cluster's API server at most once per
// HealthInterval. One that does not answer is dropped: the informers keep a
// stale picture of a dead cluster, which must not read as "all is well".
func (c *Cache) checkHealth(ctx context.Context, key types.NamespacedName, cl *Cluster) error {
	c.mu.Lock()
	due := time.Since(cl.lastHealthy) >= c.opts.HealthInterval
	c.mu.Unlock()
	if !due {
		return nil
	}
	probeCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := cl.Clientset.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(probeCtx); err != nil {
		c.Forget(key)
		return fmt.Errorf("cluster %s at %s does not answer: %w", key, cl.Config.Host, err)
	}
	c.mu.Lock()
	cl.lastHealthy = time.Now()
	c.mu.Unlock()
	return nil
}

// recentFailure returns the error of a build that failed less than
// SyncTimeout ago with the same Secret: a dead cluster costs one wait per
// SyncTimeout, not one per machine. A changed Secret is tried at once.
func (c *Cache) recentFailure(cluster types.NamespacedName, secretVersion string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, ok := c.failed[cluster]
	if !ok || f.secretVersion != secretVersion || time.Since(f.at) >= c.opts.SyncTimeout {
		return nil
	}
	return fmt.Errorf("%w (%s ago; next attempt after %s)", f.err, time.Since(f.at).Round(time.Second), c.opts.SyncTimeout)
}

// current returns the cached cluster if it was built from secretVersion.
func (c *Cache) current(cluster types.NamespacedName, secretVersion string) *Cluster {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl, ok := c.clusters[cluster]
	if !ok || cl.secretVersion != secretVersion {
		return nil
	}
	cl.lastUsed = time.Now()
	return cl
}

func (c *Cache) buildLock(cluster types.NamespacedName) *sync.Mutex {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.building[cluster]
	if !ok {
		l = &sync.Mutex{}
		c.building[cluster] = l
	}
	return l
}

// Forget drops a cluster (for example when it is deleted).
func (c *Cache) Forget(cluster types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl, ok := c.clusters[cluster]; ok {
		cl.stop()
		delete(c.clusters, cluster)
	}
}

// Stop drops every cluster; their informers end.
func (c *Cache) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, cl := range c.clusters {
		cl.stop()
		delete(c.clusters, k)
	}
}

func (c *Cache) evictLocked() {
	for len(c.clusters) >= c.opts.MaxClusters {
		var oldest types.NamespacedName
		var oldestTime time.Time
		for k, cl := range c.clusters {
			if oldestTime.IsZero() || cl.lastUsed.Before(oldestTime) {
				oldest, oldestTime = k, cl.lastUsed
			}
		}
		c.clusters[oldest].stop()
		delete(c.clusters, oldest)
	}
}

func (c *Cache) build(ctx context.Context, cluster types.NamespacedName, secret *corev1.Secret) (*Cluster, error) {
	data, ok := secret.Data[KubeconfigSecretKey]
	if !ok {
		return nil, fmt.Errorf("kubeconfig Secret %s/%s has no key %q", secret.Namespace, secret.Name, KubeconfigSecretKey)
	}
	// Users write this Secret for a cluster run elsewhere: what in it
	// would read a file of this host or run a program is refused
	// (docs/security.md).
	cfg, err := kubeconfig.InlineRESTConfig(data)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig Secret %s/%s: %w", secret.Namespace, secret.Name, err)
	}
	cfg.Timeout = 30 * time.Second
	cfg.QPS, cfg.Burst = 50, 100
	// One HTTP client (one connection to the cluster) and one REST mapper
	// serve the direct client, the clientset and the node cache: built
	// apart, each had its own, three connections and two mappers per
	// cluster.
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("building HTTP client for cluster %s: %w", cluster, err)
	}
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("building REST mapper for cluster %s: %w", cluster, err)
	}
	direct, err := client.New(cfg, client.Options{Scheme: c.scheme, HTTPClient: hc, Mapper: mapper})
	if err != nil {
		return nil, fmt.Errorf("building client for cluster %s: %w", cluster, err)
	}
	cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("building clientset for cluster %s: %w", cluster, err)
	}
	// A kubeconfig that may not watch and answer certificate requests (a
	// cluster someone else runs) costs only the approval, said on each
	// joining machine: the Nodes are watched all the same.
	var csrErr error
	byObject := map[client.Object]cache.ByObject{}
	if c.opts.OnCSREvent != nil {
		csrErr = mayAnswerCSRs(ctx, cs)
		if csrErr != nil && !errors.Is(csrErr, ErrMayNotAnswerCSRs) {
			return nil, fmt.Errorf("cluster %s at %s: %w", cluster, cfg.Host, csrErr)
		}
		if csrErr == nil {
			// Only kubelets' client certificate requests: nothing else is
			// marina's to judge.
			byObject[&certificatesv1.CertificateSigningRequest{}] = cache.ByObject{
				Field: fields.OneTermEqualSelector("spec.signerName", certificatesv1.KubeAPIServerClientKubeletSignerName)}
		}
	}
	nodes, err := cache.New(cfg, cache.Options{Scheme: c.scheme, HTTPClient: hc, Mapper: mapper, ByObject: byObject,
		// Nothing reads a Node's managedFields; a thousand Nodes' are
		// megabytes.
		DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return nil, fmt.Errorf("building node cache for cluster %s: %w", cluster, err)
	}
	if err := nodes.IndexField(ctx, &corev1.Node{}, NodeProviderIDIndex, func(o client.Object) []string {
		if id := o.(*corev1.Node).Spec.ProviderID; id != "" {
			return []string{id}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("indexing nodes of cluster %s: %w", cluster, err)
	}
	informer, err := nodes.GetInformer(ctx, &corev1.Node{})
	if err != nil {
		return nil, fmt.Errorf("watching nodes of cluster %s: %w", cluster, err)
	}
	if c.opts.OnNodeEvent != nil {
		notify := func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				c.opts.OnNodeEvent(NodeEvent{Cluster: cluster, Node: n})
			}
		}
		if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    notify,
			UpdateFunc: func(_, n any) { notify(n) },
			DeleteFunc: notify,
		}); err != nil {
			return nil, fmt.Errorf("watching nodes of cluster %s: %w", cluster, err)
		}
	}
	var csrs client.Reader
	if c.opts.OnCSREvent != nil && csrErr == nil {
		if err := c.watchCSRs(ctx, cluster, nodes); err != nil {
			return nil, err
		}
		csrs = nodes
	}
	// The informers live until the cluster is dropped, not until this request ends.
	runCtx, stop := context.WithCancel(context.Background())
	go func() { _ = nodes.Start(runCtx) }()
	syncCtx, cancel := context.WithTimeout(ctx, c.opts.SyncTimeout)
	defer cancel()
	if !nodes.WaitForCacheSync(syncCtx) {
		stop()
		return nil, fmt.Errorf("cluster %s is unreachable at %s: its caches did not sync within %s", cluster, cfg.Host, c.opts.SyncTimeout)
	}
	return &Cluster{
		Config:        cfg,
		Client:        direct,
		Clientset:     cs,
		Nodes:         nodes,
		csrs:          csrs,
		csrErr:        csrErr,
		secretVersion: secret.ResourceVersion,
		stop:          stop,
		lastUsed:      time.Now(),
		lastHealthy:   time.Now(),
	}, nil
}

// NodeByProviderID finds the cluster's Node with spec.providerID == id; nil
// when none has registered yet.
func (cl *Cluster) NodeByProviderID(ctx context.Context, id string) (*corev1.Node, error) {
	list := &corev1.NodeList{}
	if err := cl.Nodes.List(ctx, list, client.MatchingFields{NodeProviderIDIndex: id}); err != nil {
		return nil, fmt.Errorf("listing nodes by providerID: %w", err)
	}
	switch len(list.Items) {
	case 0:
		return nil, nil
	case 1:
		return &list.Items[0], nil
	default:
		return nil, fmt.Errorf("%d nodes claim providerID %s", len(list.Items), id)
	}
}

// watchCSRs adds to the cluster's cache its kubelet client certificate
// requests, indexed by who made them, reported to Options.OnCSREvent.
func (c *Cache) watchCSRs(ctx context.Context, cluster types.NamespacedName, ca cache.Cache) error {
	if err := ca.IndexField(ctx, &certificatesv1.CertificateSigningRequest{}, CSRUsernameIndex, func(o client.Object) []string {
		return []string{o.(*certificatesv1.CertificateSigningRequest).Spec.Username}
	}); err != nil {
		return fmt.Errorf("indexing certificate requests of cluster %s: %w", cluster, err)
	}
	informer, err := ca.GetInformer(ctx, &certificatesv1.CertificateSigningRequest{})
	if err != nil {
		return fmt.Errorf("watching certificate requests of cluster %s: %w", cluster, err)
	}
	notify := func(obj any) {
		if csr, ok := obj.(*certificatesv1.CertificateSigningRequest); ok {
			c.opts.OnCSREvent(CSREvent{Cluster: cluster, CSR: csr})
		}
	}
	// Deletions say nothing: a request gone needs no answer.
	if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    notify,
		UpdateFunc: func(_, n any) { notify(n) },
	}); err != nil {
		return fmt.Errorf("watching certificate requests of cluster %s: %w", cluster, err)
	}
	return nil
}

// KubeletCSRsOf lists the cluster's kubelet client certificate requests
// made by user. The cache must have been built with Options.OnCSREvent.
func (cl *Cluster) KubeletCSRsOf(ctx context.Context, user string) ([]certificatesv1.CertificateSigningRequest, error) {
	if cl.csrErr != nil {
		return nil, cl.csrErr
	}
	if cl.csrs == nil {
		return nil, errors.New("this cache does not hold certificate requests")
	}
	list := &certificatesv1.CertificateSigningRequestList{}
	if err := cl.csrs.List(ctx, list, client.MatchingFields{CSRUsernameIndex: user}); err != nil {
		return nil, fmt.Errorf("listing certificate requests of %s: %w", user, err)
	}
	return list.Items, nil
}

// csrRights are what answering kubelets' certificate requests takes.
var csrRights = []authorizationv1.ResourceAttributes{
	{Group: certificatesv1.GroupName, Resource: "certificatesigningrequests", Verb: "list"},
	{Group: certificatesv1.GroupName, Resource: "certificatesigningrequests", Verb: "watch"},
	{Group: certificatesv1.GroupName, Resource: "certificatesigningrequests", Subresource: "approval", Verb: "update"},
	{Group: certificatesv1.GroupName, Resource: "signers", Name: certificatesv1.KubeAPIServerClientKubeletSignerName, Verb: "approve"},
}

// ErrMayNotAnswerCSRs says marina's kubeconfig of a cluster may not watch
// or answer its kubelets' certificate requests.
var ErrMayNotAnswerCSRs = errors.New("marina's kubeconfig of the cluster may not answer its kubelets' certificate requests")

// mayAnswerCSRs asks the cluster whether marina's credential may do what
// answering kubelets' certificate requests takes.
func mayAnswerCSRs(ctx context.Context, cs kubernetes.Interface) error {
	var missing []string
	for _, ra := range csrRights {
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &ra}}
		got, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("asking whether marina may answer certificate requests: %w", err)
		}
		if !got.Status.Allowed {
			what := ra.Verb + " " + ra.Resource
			if ra.Subresource != "" {
				what += "/" + ra.Subresource
			}
			if ra.Name != "" {
				what += " " + ra.Name
			}
			missing = append(missing, what)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: grant it %s (%s)", ErrMayNotAnswerCSRs, strings.Join(missing, ", "), certificatesv1.GroupName)
	}
	return nil
}
