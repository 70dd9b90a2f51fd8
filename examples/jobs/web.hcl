# A web service: busybox httpd in a docker task serves the files of the host volume "shared" on a
# dynamic port. Mounts made on the host below the volume after start propagate into the task
# (host-to-task), so they are served too.
#
#   driversdk validate examples/jobs/web.hcl --client examples/jobs/client.hcl
#   driversdk run examples/jobs/web.hcl --client examples/jobs/client.hcl
#
# `run` prints the port it picked (==> group "web": ports: http 23456->8080); the server answers
# on this host's address (the one its default route leaves by, `hostname -I`):
#
#   curl http://<host address>:23456/
#
# Ctrl-C stops it. The image is the local test image (hack/build-test-images.sh builds it).
job "web" {
  group "web" {
    network {
      port "http" {
        to = 8080
      }
    }

    volume "shared" {
      type      = "host"
      source    = "shared"
      read_only = true
    }

    task "web" {
      driver = "docker"
      config {
        image = "driversdk-test/busybox:local"
        ports = ["http"]
        # httpd is the container's PID 1, which ignores signals it does not handle: the shell
        # stops it on the driver's SIGINT/SIGTERM, so Ctrl-C ends the task at once.
        command = "/bin/sh"
        args    = ["-c", "httpd -f -p 8080 -h /data & trap 'kill $!; exit 0' INT TERM; wait"]
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
