"""A small reference CSI plugin: volumes are directories, staging and publishing are bind mounts."""
