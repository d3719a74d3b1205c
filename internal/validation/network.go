package validation

import (
	"fmt"
	"net/netip"
	"regexp"

	"k8s.io/apimachinery/pkg/util/validation/field"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/ownedflags"
)

// MaxServiceNetworkHostBits is the largest number of host bits a service
// network may have: kube-apiserver refuses a --service-cluster-ip-range
// wider than that (a /12 for IPv4, a /108 for IPv6), because it tracks every
// service IP in a bitmap.
const MaxServiceNetworkHostBits = 20

// serviceNetworks checks that each service network is one kube-apiserver
// accepts. Networks that do not parse are left to the schema, which refuses
// them with its own message.
func serviceNetworks(cidrs []clusterv1.CIDR, fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, c := range cidrs {
		prefix, err := netip.ParsePrefix(string(c))
		if err != nil {
			continue
		}
		bits := prefix.Addr().BitLen()
		if bits-prefix.Bits() > MaxServiceNetworkHostBits {
			errs = append(errs, field.Invalid(fldPath.Index(i), string(c), fmt.Sprintf(
				"is larger than kube-apiserver accepts for services: use a prefix of /%d or longer, e.g. %s",
				bits-MaxServiceNetworkHostBits, serviceExample(bits))))
		}
	}
	return errs
}

func serviceExample(bits int) string {
	if bits == 32 {
		return "10.96.0.0/12"
	}
	return "fd00:10:96::/108"
}

// endpointHost checks an API server host: an IP address or a DNS name.
func endpointHost(host string, fldPath *field.Path) field.ErrorList {
	if host == "" {
		return nil
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if errs := dnsSubdomain(host, fldPath); len(errs) > 0 {
		errs[0].Detail = "must be an IP address or a DNS name such as api.example.com: " + errs[0].Detail
		return errs
	}
	return nil
}

// flagName is what a command-line flag's name looks like without its
// leading dashes: kube-apiserver's, kube-controller-manager's and
// kube-scheduler's flags are lower-case words joined by '-' (audit-log-maxage),
// a few with '.' or '_'.
var flagName = regexp.MustCompile(`^[a-z0-9][-a-z0-9._]*$`)

// extraArgs checks the keys of a component's extra flags: flag names, and
// none of those marina owns (ownedflags): extraArgs tune how a component
// behaves, not how it is wired to addresses, files, credentials and etcd.
func extraArgs(component string, args map[string]string, fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, k := range sortedKeys(args) {
		p := fldPath.Key(k)
		switch {
		case len(k) > 0 && k[0] == '-':
			errs = append(errs, field.Invalid(p, k, "write the flag name without leading dashes, e.g. audit-log-maxage rather than --audit-log-maxage"))
		case !flagName.MatchString(k):
			errs = append(errs, field.Invalid(p, k, "must be a flag name without dashes or value, e.g. v or audit-log-maxage: lower-case letters, digits, '-', '.' and '_'; put the value in the map's value"))
		default:
			if reason, owned := ownedflags.Owned(component, k); owned {
				errs = append(errs, field.Forbidden(p, fmt.Sprintf(
					"%s --%s is owned by marina: %s. extraArgs may tune a component's behaviour, not its wiring: remove this flag (docs/security.md lists the flags marina owns)", component, k, reason)))
			}
		}
	}
	return errs
}
