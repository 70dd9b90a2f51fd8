# Client config for the examples: the host volume web.hcl serves, the CSI demo's plugin store,
# and the plugins with their config. A job with a csi_plugin task needs a data_dir of at most
# 42 characters (unix socket paths).
data_dir = "/var/lib/driversdk"

client {
  host_volume "shared" {
    path = "/srv/driversdk-shared"
  }
  # csi-demo.hcl's plugin keeps its volumes here (volumes/<id>).
  host_volume "csi-backing" {
    path = "/srv/driversdk-csi"
  }
}

plugin "docker" {
  config {
    gc {
      image = false
    }
  }
}

# csi-demo.hcl's plugin task mounts: it runs as root with sys_admin, and sees the install of
# driversdk that provides its console script. Nomad's default chroot_env (below) holds a pip
# install into the system Python (/usr); for a venv, add its directory, e.g. "/opt/venv", and run
# the job with -var csi_plugin_command=/opt/venv/bin/driversdk-csi-hostpath.
plugin "exec" {
  config {
    allow_caps       = ["audit_write", "chown", "dac_override", "fowner", "fsetid", "kill", "mknod",
                        "net_bind_service", "setfcap", "setgid", "setpcap", "setuid", "sys_chroot", "sys_admin"]
    chroot_env       = ["/bin", "/etc", "/lib", "/lib32", "/lib64", "/sbin", "/usr"]
    denied_host_uids = ""
    denied_host_gids = ""
  }
}

plugin "hello" {
  command = ["python3", "examples/hello_driver.py"]
}
