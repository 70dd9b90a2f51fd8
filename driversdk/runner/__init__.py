"""From job files to checked task mounts: jobspec, client config, validation."""
