# Client config for the examples: a host volume, and the plugins with their config.
data_dir = "/var/lib/driversdk"

client {
  host_volume "shared" {
    path = "/srv/driversdk-shared"
  }
}

plugin "docker" {
  config {
    gc {
      image = false
    }
  }
}

plugin "hello" {
  command = ["python3", "examples/hello_driver.py"]
}
