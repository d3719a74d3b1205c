# Checks the host can take the machine: the tools the next steps use, and
# room for the binaries and the machine's data.
set -eu
for tool in flock setsid df awk; do
	command -v "$tool" >/dev/null || { echo "$tool is missing on {{.Host.Address}}: install it (util-linux, coreutils, gawk)"; exit 1; }
done
avail=$(df -Pk {{quote .Dir}} | awk 'NR==2 {print $4}')
if [ "$avail" -lt {{.MinFreeKiB}} ]; then
	echo "only ${avail} KiB free under {{.Dir}} on {{.Host.Address}}; the machine needs {{.MinFreeKiB}} KiB: free some space"
	exit 1
fi
echo "{{.Role}} machine {{.Machine.Namespace}}/{{.Machine.Name}} on {{.Host.Address}}: ${avail} KiB free"
