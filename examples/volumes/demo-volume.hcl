# A volume of the reference hostpath CSI plugin (plugin_id "hostpath"), for examples/jobs/csi-demo.hcl.
id          = "demo-volume"
name        = "demo-volume"
type        = "csi"
plugin_id   = "hostpath"
external_id = "demo-volume"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
