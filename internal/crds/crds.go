// Package crds installs marina's CustomResourceDefinitions, embedded in the
// binary from config/crd/bases, into an API server and waits until the API
// server serves them.
package crds

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"marina.dev/marina/config"
)

// FieldOwner is the field manager of every CRD marina installs.
const FieldOwner = "marina"

// Load returns the embedded CRDs.
func Load() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var out []*apiextensionsv1.CustomResourceDefinition
	err := fs.WalkDir(config.CRDs, config.CRDDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path.Ext(p) != ".yaml" {
			return err
		}
		data, err := fs.ReadFile(config.CRDs, p)
		if err != nil {
			return err
		}
		for _, doc := range strings.Split(string(data), "\n---") {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := yaml.UnmarshalStrict([]byte(doc), crd); err != nil {
				return fmt.Errorf("decoding %s: %w", p, err)
			}
			out = append(out, crd)
		}
		return nil
	})
	return out, err
}

// Install creates or updates every embedded CRD and waits until each is
// Established. Installing the same CRDs again changes nothing.
func Install(ctx context.Context, c client.Client) error {
	list, err := Load()
	if err != nil {
		return fmt.Errorf("loading embedded CRDs: %w", err)
	}
	for _, want := range list {
		if err := apply(ctx, c, want); err != nil {
			return err
		}
	}
	for _, want := range list {
		if err := waitEstablished(ctx, c, want.Name); err != nil {
			return err
		}
	}
	return nil
}

func apply(ctx context.Context, c client.Client, want *apiextensionsv1.CustomResourceDefinition) error {
	have := &apiextensionsv1.CustomResourceDefinition{}
	err := c.Get(ctx, client.ObjectKeyFromObject(want), have)
	switch {
	case apierrors.IsNotFound(err):
		if err := c.Create(ctx, want.DeepCopy(), client.FieldOwner(FieldOwner)); err != nil {
			return fmt.Errorf("creating CRD %s: %w", want.Name, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("reading CRD %s: %w", want.Name, err)
	}
	have.Spec = want.Spec
	have.Labels = want.Labels
	have.Annotations = want.Annotations
	if err := c.Update(ctx, have, client.FieldOwner(FieldOwner)); err != nil {
		return fmt.Errorf("updating CRD %s: %w", want.Name, err)
	}
	return nil
}

func waitEstablished(ctx context.Context, c client.Client, name string) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			return false, nil
		}
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.NamesAccepted && cond.Status == apiextensionsv1.ConditionFalse {
				return false, fmt.Errorf("CRD %s names not accepted: %s", name, cond.Message)
			}
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for CRD %s to be established: %w", name, err)
	}
	return nil
}
