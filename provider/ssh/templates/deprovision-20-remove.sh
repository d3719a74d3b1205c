# Removes what the machine left on the host but the provisioning log
# ({{.LogDir}}).
set -eu
rm -rf {{quote .SandboxDir}} {{quote .BinDir}}
echo "removed {{.SandboxDir}} and {{.BinDir}}"
