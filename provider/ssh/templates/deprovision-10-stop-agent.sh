# Stops the node agent and every process it started (its control-plane
# components are in its process group), then any process still running a
# binary of {{.BinDir}}.
set -u
if [ -f /etc/systemd/system/marina-agent.service ] && command -v systemctl >/dev/null; then
	systemctl disable --now marina-agent.service || true
	rm -f /etc/systemd/system/marina-agent.service
	systemctl daemon-reload || true
fi
pid=$(cat {{quote .SandboxDir}}/agent.pid 2>/dev/null || true)
if [ -n "$pid" ]; then
	kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
	for _ in $(seq 1 100); do
		flock -n {{quote .SandboxDir}}/agent.lock true 2>/dev/null && break
		sleep 0.1
	done
	kill -KILL -- "-$pid" 2>/dev/null || true
fi
for p in /proc/[0-9]*; do
	exe=$(readlink "$p/exe" 2>/dev/null) || continue
	case $exe in
	{{quote .BinDir}}/*) echo "stopping ${p#/proc/} ($exe)"; kill -KILL "${p#/proc/}" 2>/dev/null || true ;;
	esac
done
echo "agent of {{.Machine.Namespace}}/{{.Machine.Name}} stopped"
