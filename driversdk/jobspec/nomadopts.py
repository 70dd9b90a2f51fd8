"""What Nomad's own docker and exec drivers accept: their plugin options (agent config
``plugin "docker" { config { … } }``) and their task ``config {}`` keys.

Our bundled drivers validate their config through their own hclspec, and some of Nomad's
options are not theirs (docker ``ports``, ``dns_servers``, exec ``no_pivot_root`` …). With these
sets the runner tells "Nomad knows it, driversdk does not act on it" (a note, the key left out)
from "nobody knows it" (a problem with did-you-mean). A nested dict is a block's options; None
an argument. Our drivers' own additions are listed too, so the loader knows every name.
"""

from __future__ import annotations

from typing import Any

Options = dict[str, Any]

_DANGLING: Options = {"enabled": None, "period": None, "creation_grace": None, "dry_run": None}

PLUGIN_OPTIONS: dict[str, Options] = {
    "docker": {
        "endpoint": None,
        "auth": {"config": None, "helper": None},
        "tls": {"cert": None, "key": None, "ca": None},
        "extra_labels": None,
        "logging": {"type": None, "config": None},
        "gc": {"image": None, "image_delay": None, "container": None, "dangling_containers": _DANGLING},
        "volumes": {"enabled": None, "selinuxlabel": None},
        "allow_privileged": None,
        "allow_caps": None,
        "nvidia_runtime": None,
        "allow_runtimes": None,
        "infra_image": None,
        "infra_image_pull_timeout": None,
        "pull_activity_timeout": None,
        "pids_limit": None,
        "disable_log_collection": None,
        "windows_allow_insecure_container_admin": None,
        "image_pull_timeout": None,
        "oom_score_adj": None,
        "container_exists_attempts": None,
        "allowed_modes": {"network": None, "ipc": None, "pid": None, "uts": None, "userns": None},
    },
    "exec": {
        "default_pid_mode": None,
        "default_ipc_mode": None,
        "no_pivot_root": None,
        "allow_caps": None,
        "denied_host_uids": None,
        "denied_host_gids": None,
        # driversdk's exec (runc) additions
        "runtime_path": None,
        "state_dir": None,
        "chroot_env": None,
        "disable_log_collection": None,
        "bridge_name": None,
        "bridge_subnet": None,
        "cgroup_parent": None,
        "reconcile": {"enabled": None, "period": None, "creation_grace": None},
    },
    "raw_exec": {
        "enabled": None,
        "no_cgroups": None,
        "denied_host_uids": None,
        "denied_host_gids": None,
        "denied_envvars": None,
        # driversdk's raw_exec additions
        "state_dir": None,
        "cgroup_parent": None,
        "reconcile": {"enabled": None, "period": None, "creation_grace": None},
    },
}

TASK_CONFIG: dict[str, frozenset[str]] = {
    "docker": frozenset(
        [
            "image",
            "advertise_ipv6_address",
            "args",
            "auth",
            "auth_soft_fail",
            "cap_add",
            "cap_drop",
            "command",
            "cpuset_cpus",
            "cpu_hard_limit",
            "cpu_cfs_period",
            "devices",
            "dns_search_domains",
            "dns_options",
            "dns_servers",
            "entrypoint",
            "extra_hosts",
            "force_pull",
            "group_add",
            "healthchecks",
            "hostname",
            "init",
            "interactive",
            "ipc_mode",
            "ipv4_address",
            "ipv6_address",
            "isolation",
            "labels",
            "load",
            "logging",
            "mac_address",
            "memory_hard_limit",
            "mount",
            "mounts",
            "network_aliases",
            "network_mode",
            "runtime",
            "pids_limit",
            "pid_mode",
            "ports",
            "port_map",
            "privileged",
            "image_pull_timeout",
            "readonly_rootfs",
            "security_opt",
            "shm_size",
            "storage_opt",
            "sysctl",
            "tty",
            "ulimit",
            "uts_mode",
            "userns_mode",
            "volumes",
            "volume_driver",
            "work_dir",
            "oom_score_adj",
        ]
    ),
    "exec": frozenset(["command", "args", "pid_mode", "ipc_mode", "cap_add", "cap_drop", "work_dir"]),
    "raw_exec": frozenset(["command", "args", "cgroup_v1_override", "cgroup_v2_override", "oom_score_adj", "work_dir"]),
}
