# The CSI demo: the reference hostpath CSI plugin runs as an exec task (csi_plugin), and a docker
# task mounts a volume it publishes, with host-to-task propagation.
#
#   driversdk volume register examples/volumes/demo-volume.hcl --client client.hcl
#   driversdk run examples/jobs/csi-demo.hcl --client client.hcl
#
# examples/demo.py writes a matching client.hcl (a host volume for the plugin's backing store, and
# the exec plugin allowed sys_admin with the Python installation in its chroot) and runs all of it.
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
        command = "/usr/bin/python3"
        args    = ["-m", "driversdk.csi.hostpath"]
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
