// Package config holds marina's deployment manifests (kustomize) and embeds
// the generated CRDs and webhook configuration so that `marina up` installs
// exactly what the tests use.
package config

import "embed"

// CRDs holds the generated CustomResourceDefinitions (crd/bases/*.yaml).
//
//go:embed crd/bases
var CRDs embed.FS

// CRDDir is the directory inside CRDs that holds the YAML files.
const CRDDir = "crd/bases"

// Webhook holds the generated admission webhook configuration
// (webhook/manifests.yaml): `marina up` installs it pointing at its
// in-process server.
//
//go:embed webhook/manifests.yaml
var Webhook []byte

// Install holds what `marina init` installs beside the CRDs and the webhook
// configuration: the namespace and controller Deployment, RBAC, the
// webhook's Service and the tenancy policy. The kustomization files are
// kubectl's; marina init reads the manifests they list.
//
//go:embed manager/manager.yaml rbac/*.yaml webhook/service.yaml tenancy/policy.yaml
var Install embed.FS
