# A docker task that sees a host volume, with mounts made on the host after start
# propagating into it (host-to-task). Check it: driversdk validate examples/jobs/web.hcl --client examples/jobs/client.hcl
job "web" {
  group "web" {
    volume "shared" {
      type      = "host"
      source    = "shared"
      read_only = true
    }

    task "web" {
      driver = "docker"
      config {
        image   = "driversdk-test/busybox:local"
        command = "/bin/sh"
        args    = ["-c", "ls /data; sleep 3600"]
      }
      volume_mount {
        volume           = "shared"
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
