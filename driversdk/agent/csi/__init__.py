"""The client's CSI side: the volume store, claims (stage and publish), the volume watcher that ends
every claim, the operator's volume commands, CSI plugin tasks and the node's plugin registry."""
