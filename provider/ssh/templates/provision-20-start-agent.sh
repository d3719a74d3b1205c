# Starts the node agent so that it outlives this SSH session: a systemd
# unit where the host runs systemd (it also survives a reboot), else a
# process of its own session. A running agent is left alone.
set -eu
cd {{quote .SandboxDir}}
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
	cat > /etc/systemd/system/marina-agent.service <<UNIT
[Unit]
Description=marina node agent of {{.Machine.Namespace}}/{{.Machine.Name}}
After=network-online.target
[Service]
ExecStart={{.AgentCommand}}
WorkingDirectory={{.SandboxDir}}
Restart=always
RestartSec=2
KillMode=control-group
[Install]
WantedBy=multi-user.target
UNIT
	systemctl daemon-reload
	systemctl enable --now marina-agent.service
	echo "agent started as systemd unit marina-agent.service"
	exit 0
fi
if ! flock -n {{quote .SandboxDir}}/agent.lock true; then
	echo "agent already running (pid $(cat agent.pid 2>/dev/null))"
	exit 0
fi
setsid nohup {{.AgentCommand}} >>{{quote .SandboxDir}}/agent.log 2>&1 </dev/null &
echo $! > agent.pid
echo "agent started, pid $!"
