package machinedeployment

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strconv"

	"k8s.io/apimachinery/pkg/util/rand"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// TemplateHash is the hash naming a template's MachineSet: FNV-32a of the
// template's JSON (map keys sorted, providerSpec as the API server stores
// it), encoded as Kubernetes encodes pod-template-hash.
func TemplateHash(t *clusterv1.MachineTemplateSpec) (string, error) {
	data, err := json.Marshal(t)
	if err != nil {
		return "", fmt.Errorf("encoding the machine template: %w", err)
	}
	h := fnv.New32a()
	_, _ = h.Write(data)
	return rand.SafeEncodeString(strconv.FormatUint(uint64(h.Sum32()), 10)), nil
}
