# The CSI demo: the reference hostpath CSI plugin runs as an exec task (csi_plugin), and a docker
# task mounts a volume it publishes, with host-to-task propagation.
#
#   driversdk volume register examples/volumes/demo-volume.hcl --client examples/jobs/client.hcl
#   driversdk run examples/jobs/csi-demo.hcl --client examples/jobs/client.hcl \
#     -var csi_plugin_command="$(command -v driversdk-csi-hostpath)"
#
# The plugin is the `driversdk-csi-hostpath` executable an install of driversdk provides; the exec
# task must see it and the Python installation it runs with, so the client's exec plugin lists that
# installation (a venv's directory, or the Python prefix) in chroot_env. Outside /tmp: every exec
# task gets a /tmp of its own. examples/demo.py writes such a client config and runs all of it.

variable "csi_plugin_command" {
  type        = string
  description = "the reference CSI plugin's executable: a path, or a name on the task's PATH (/usr/local/bin, /usr/bin, /bin)"
  default     = "driversdk-csi-hostpath"
}

job "csi-demo" {
  type = "batch"

  group "storage" {
    volume "backing" {
      type   = "host"
      source = "csi-backing"
    }

    task "plugin" {
      driver = "exec"
      user   = "root" # it mounts; the client's exec plugin allows root (denied_host_uids = "")
      config {
        command = var.csi_plugin_command
        cap_add = ["sys_admin"]
      }
      env {
        CSI_HOSTPATH_ROOT = "/srv/csi"
      }
      volume_mount {
        volume      = "backing"
        destination = "/srv/csi"
      }
      csi_plugin {
        id             = "hostpath"
        type           = "monolith"
        mount_dir      = "/csi"
        health_timeout = "30s"
      }
      resources {
        cpu    = 100
        memory = 256
      }
    }
  }

  group "app" {
    volume "data" {
      type            = "csi"
      source          = "demo-volume"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }

    task "app" {
      driver = "docker"
      config {
        image   = "driversdk-test/busybox:local"
        command = "/bin/sh"
        args    = ["-c", "grep ' /data ' /proc/self/mountinfo; date > /data/written-by-app; echo wrote: $(cat /data/written-by-app)"]
      }
      volume_mount {
        volume           = "data"
        destination      = "/data"
        propagation_mode = "host-to-task"
      }
      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
